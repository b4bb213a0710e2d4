module github.com/redlockd/redlockd/examples/go

go 1.19

require github.com/redlockd/redlockd/clients/go v0.0.0

replace github.com/redlockd/redlockd/clients/go => ../../clients/go
