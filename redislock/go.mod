module github.com/fairlock/fairlock/redislock

go 1.26.0

require (
	github.com/fairlock/fairlock v0.1.0
	github.com/fairlock/fairlock/redislock/redistest v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/petermattis/goid v0.0.0-20260820044319-269ab09b5261 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
