package redlockd

import (
	"math/rand"
	"sync"
	"time"
)

// jitterSource is seeded per process: the package-level math/rand source of older Go
// releases starts from the same seed in every process, which would have every client
// "spread" its retries identically.
var (
	jitterMu     sync.Mutex
	jitterSource = rand.New(rand.NewSource(time.Now().UnixNano()))
)

// jittered is a wait of d spread evenly over its second half: clients that failed
// together (a replica restarted under all of them) do not all retry in the same instant.
func jittered(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	half := d / 2
	jitterMu.Lock()
	extra := time.Duration(jitterSource.Int63n(int64(d-half) + 1))
	jitterMu.Unlock()
	return half + extra
}
