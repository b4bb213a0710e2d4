module github.com/redlockd/redlockd/clients/go

go 1.19
