module layered

go 1.24
