// roundtrip measures one grant + release through the client against REDLOCKD_SERVER and
// prints the median and p99 (scripts/client-bench runs it beside the other clients').
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	redlockd "github.com/redlockd/redlockd/clients/go"
)

func main() {
	n, _ := strconv.Atoi(os.Getenv("ROUNDS"))
	if n == 0 {
		n = 1000
	}
	client, err := redlockd.New(redlockd.Options{Servers: []string{os.Getenv("REDLOCKD_SERVER")}})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	took := make([]time.Duration, 0, n)
	for i := 0; i < n+n/10; i++ {
		started := time.Now()
		lease, err := client.Lock(ctx, "bench:go", redlockd.LockOptions{TTL: 10 * time.Second})
		if err != nil {
			panic(err)
		}
		if err := lease.Release(ctx); err != nil {
			panic(err)
		}
		if i >= n/10 { // the first tenth warms up connections
			took = append(took, time.Since(started))
		}
	}
	sort.Slice(took, func(a, b int) bool { return took[a] < took[b] })
	fmt.Printf("go         median %6.0f µs  p99 %6.0f µs\n",
		float64(took[len(took)/2].Microseconds()), float64(took[len(took)*99/100].Microseconds()))
}
