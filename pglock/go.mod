module github.com/fairlock/fairlock/pglock

go 1.26.0

require (
	github.com/fairlock/fairlock v0.1.0
	github.com/fairlock/fairlock/pglock/pgtest v0.1.0
	github.com/google/go-cmp v0.7.0
	github.com/jackc/pgx/v5 v5.13.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/petermattis/goid v0.0.0-20260820044319-269ab09b5261 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
