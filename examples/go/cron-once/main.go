// cron-once: a job that must run once per tick although every instance fires it.
//
// Eight instances (goroutines here; processes or hosts in real life) fire the nightly job
// at about the same time. Each tries the tick's lock without waiting; the one that gets it
// runs the job and keeps the lock a while after it finishes, so that an instance whose
// clock fires a little late finds it held. The others skip.
//
//	REDLOCKD_SERVER=http://127.0.0.1:8080 go run ./cron-once [-instances 8] [-tick 2026-11-23]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	redlockd "github.com/redlockd/redlockd/clients/go"
)

func main() {
	instances := flag.Int("instances", 8, "how many instances fire the job")
	tick := flag.String("tick", time.Now().Format("2006-01-02"), "the tick's name")
	flag.Parse()
	server := os.Getenv("REDLOCKD_SERVER")
	if server == "" {
		server = "http://127.0.0.1:8080"
	}
	var wg sync.WaitGroup
	for i := 0; i < *instances; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			client, err := redlockd.New(redlockd.Options{Servers: []string{server}})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			ran, err := client.RunOncePerTick(context.Background(), "cron:nightly-report:"+*tick,
				5*time.Second, 0, func(ctx context.Context, lease *redlockd.Lease) error {
					// The real job would send the report, stamped with the fencing token.
					time.Sleep(200 * time.Millisecond)
					fmt.Printf("instance %d: report sent (token %d)\n", i, lease.FencingToken)
					return lease.EnsureValid(0)
				})
			switch {
			case err != nil:
				fmt.Printf("instance %d: failed: %v\n", i, err)
			case !ran:
				fmt.Printf("instance %d: skipped: another instance ran it\n", i)
			}
		}(i)
	}
	wg.Wait()
}
