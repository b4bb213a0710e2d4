package redlockd

import (
	"testing"
	"time"
)

func TestJitteredWaitsLieBetweenHalfAndAllAndVary(t *testing.T) {
	d := 800 * time.Millisecond
	seen := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		w := jittered(d)
		if w < d/2 || w > d {
			t.Fatalf("jittered(%v) = %v, outside [%v, %v]", d, w, d/2, d)
		}
		seen[w] = true
	}
	if len(seen) < 100 {
		t.Fatalf("jittered waits barely vary: %d distinct of 200", len(seen))
	}
	if jittered(0) != 0 {
		t.Fatal("jittered(0) != 0")
	}
}
