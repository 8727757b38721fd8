module cyclic

go 1.24
