package redlockd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	redlockd "github.com/redlockd/redlockd/clients/go"
)

func client(t *testing.T, servers ...string) *redlockd.Client {
	c, err := redlockd.New(redlockd.Options{Servers: servers})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func token(v any) uint64 {
	f, _ := v.(float64)
	return uint64(f)
}

func TestLockRenewsInTheBackgroundAndReleases(t *testing.T) {
	c := startCluster(t, 1)
	ctx := context.Background()
	lease, err := client(t, c.urls()...).Lock(ctx, "report", redlockd.LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := lease.EnsureValid(0); err != nil {
		t.Fatalf("still valid after three TTLs: %v", err)
	}
	if got := token(held(t, c.urls()[0], "report")["fencing_token"]); got != lease.FencingToken {
		t.Fatalf("held with token %d, lease has %d", got, lease.FencingToken)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if held(t, c.urls()[0], "report")["held"] != false {
		t.Fatal("still held after release")
	}
	if lease.Context().Err() == nil {
		t.Fatal("the lease's context ends with the lease")
	}
}

func TestRenewCarriesOnThroughAReplicasDeath(t *testing.T) {
	c := startCluster(t, 2)
	a, b := c.replicas[0], c.replicas[1]
	lease, err := client(t, a.url, b.url).Lock(context.Background(), "failover", redlockd.LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	time.Sleep(3 * time.Second)
	if err := lease.EnsureValid(0); err != nil {
		t.Fatalf("renewed through the other replica: %v", err)
	}
	if got := token(held(t, b.url, "failover")["fencing_token"]); got != lease.FencingToken {
		t.Fatalf("held with token %d, lease has %d", got, lease.FencingToken)
	}
	_ = lease.Release(context.Background())
}

// A renew that hangs (the replica paused) ends at the jeopardy point, not at the end of
// the validity: the warning comes first, with time left.
func TestJeopardyIsToldBeforeTheLossWhenTheReplicaStopsAnswering(t *testing.T) {
	c := startCluster(t, 1)
	var mu sync.Mutex
	var told []string
	var left time.Duration
	cl, err := redlockd.New(redlockd.Options{
		Servers: c.urls(),
		OnJeopardy: func(_ redlockd.Held, l time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			told = append(told, "jeopardy")
			left = l
		},
		OnSafe: func(redlockd.Held) {
			mu.Lock()
			defer mu.Unlock()
			told = append(told, "safe")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cl.Lock(context.Background(), "hangs", redlockd.LockOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c.replicas[0].pause()
	select {
	case <-lease.Done():
	case <-time.After(6 * time.Second):
	}
	c.replicas[0].resume()
	if lease.LostReason() != "expired" {
		t.Fatalf("lost reason %q, want expired", lease.LostReason())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) == 0 || told[0] != "jeopardy" {
		t.Fatalf("told %v, want jeopardy first", told)
	}
	if left < 500*time.Millisecond {
		t.Fatalf("told with only %v left", left)
	}
}

func TestJeopardyIsToldBeforeTheLossAndSafeWhenARenewGetsThrough(t *testing.T) {
	c := startCluster(t, 1)
	var mu sync.Mutex
	var told []string
	var left time.Duration
	var held []redlockd.Held
	record := func(what string, h redlockd.Held, l time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, what)
		held = append(held, h)
		if what == "jeopardy" {
			left = l
		}
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(told)
	}
	cl, err := redlockd.New(redlockd.Options{
		Servers:    c.urls(),
		OnJeopardy: func(h redlockd.Held, l time.Duration) { record("jeopardy", h, l) },
		OnSafe:     func(h redlockd.Held) { record("safe", h, 0) },
	})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cl.Lock(context.Background(), "shaky", redlockd.LockOptions{TTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.masters[:2] {
		m.pause()
	}
	waitFor(t, "jeopardy", 5*time.Second, func() bool { return count() > 0 })
	inJeopardy := lease.InJeopardy()
	for _, m := range c.masters[:2] {
		m.resume()
	}
	if !inJeopardy {
		t.Fatal("InJeopardy is false after OnJeopardy")
	}
	waitFor(t, "safe", 5*time.Second, func() bool { return count() > 1 })
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(told, ",") != "jeopardy,safe" || held[0] != lease || held[1] != lease {
		t.Fatalf("told %v about %v", told, held)
	}
	if left <= 0 || left > 550*time.Millisecond {
		t.Fatalf("jeopardy with %v left", left)
	}
	if lease.InJeopardy() || lease.EnsureValid(0) != nil {
		t.Fatalf("not held again: %v", lease.EnsureValid(0))
	}
	_ = lease.Release(context.Background())
}

func TestLossCancelsTheContextWhenAMajorityStops(t *testing.T) {
	c := startCluster(t, 1)
	var told atomic.Int32
	cl := client(t, c.urls()...)
	lease, err := cl.Lock(context.Background(), "majority",
		redlockd.LockOptions{TTL: time.Second, OnLost: func(*redlockd.Lease) { told.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	for _, m := range c.masters[:2] {
		m.pause()
	}
	defer func() {
		for _, m := range c.masters[:2] {
			m.resume()
		}
	}()
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease's context was not cancelled")
	}
	if took := time.Since(granted); took > 1250*time.Millisecond {
		t.Fatalf("loss signalled %v after the grant, past the validity", took)
	}
	if told.Load() != 1 || lease.LostReason() != "expired" {
		t.Fatalf("OnLost called %d times, reason %q", told.Load(), lease.LostReason())
	}
	if err := lease.EnsureValid(0); !errors.Is(err, redlockd.ErrLeaseLost) {
		t.Fatalf("EnsureValid: %v", err)
	}
	if _, err := cl.Lock(context.Background(), "other", redlockd.LockOptions{TTL: time.Second}); !errors.Is(err, redlockd.ErrUnavailable) {
		t.Fatalf("a grant without a majority: %v", err)
	}
}

func TestDeferredReleaseRunsOnAPanic(t *testing.T) {
	c := startCluster(t, 1)
	cl := client(t, c.urls()...)
	func() {
		defer func() { _ = recover() }()
		lease, err := cl.Lock(context.Background(), "panics", redlockd.LockOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(context.Background())
		panic("boom")
	}()
	if held(t, c.urls()[0], "panics")["held"] != false {
		t.Fatal("still held after the panic")
	}
}

func TestErrorsAreTyped(t *testing.T) {
	c := startCluster(t, 1)
	cl := client(t, c.urls()...)
	ctx := context.Background()
	lease, err := cl.Lock(ctx, "typed", redlockd.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	_, err = cl.Lock(ctx, "typed", redlockd.LockOptions{Wait: 50 * time.Millisecond})
	var e *redlockd.Error
	if !errors.Is(err, redlockd.ErrLockHeld) || !errors.As(err, &e) || e.RetryAfter < 25*time.Second {
		t.Fatalf("held: %v", err)
	}
	if _, err := cl.Lock(ctx, "no spaces", redlockd.LockOptions{}); !errors.Is(err, redlockd.ErrBadRequest) {
		t.Fatalf("bad name: %v", err)
	}
	nobody, _ := redlockd.New(redlockd.Options{Servers: []string{"http://127.0.0.1:9"}, Timeout: 500 * time.Millisecond})
	if _, err := nobody.Lock(ctx, "typed", redlockd.LockOptions{}); !errors.Is(err, redlockd.ErrUnavailable) {
		t.Fatalf("nobody listening: %v", err)
	}
}

func TestAGrantWhoseAnswerIsLostIsRetriedWithItsKey(t *testing.T) {
	c := startCluster(t, 2)
	proxy := startLosingProxy(t, c.replicas[0].url)
	b := c.replicas[1]
	ctx := context.Background()
	lease, err := client(t, proxy.url, b.url).Lock(ctx, "lost-answer", redlockd.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(proxy.requests) != 1 || !strings.Contains(strings.ToLower(proxy.requests[0]), "idempotency-key: ") {
		t.Fatalf("the first attempt went through the proxy with a key: %q", proxy.requests)
	}
	if got := token(held(t, b.url, "lost-answer")["fencing_token"]); got != lease.FencingToken {
		t.Fatalf("held with token %d, the retry answered %d", got, lease.FencingToken)
	}
	_ = lease.Release(ctx)
	if held(t, b.url, "lost-answer")["held"] != false {
		t.Fatal("one release frees it: one lease")
	}
}

func TestOncePerTickRunsOnOneOfEight(t *testing.T) {
	c := startCluster(t, 1)
	var ran atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client(t, c.urls()...).RunOncePerTick(context.Background(), "tick:1", 500*time.Millisecond, 0,
				func(context.Context, *redlockd.Lease) error { ran.Add(1); return nil })
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ran.Load() != 1 {
		t.Fatalf("ran %d times", ran.Load())
	}
}

func TestCampaignProclaimObserveResign(t *testing.T) {
	c := startCluster(t, 1)
	cl := client(t, c.urls()...)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	var events []redlockd.LeaderEvent
	done := make(chan error)
	go func() {
		done <- cl.Observe(ctx, "primary", func(e redlockd.LeaderEvent) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
		})
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(events) }
	waitFor(t, "the observer's first event", 5*time.Second, func() bool { return count() > 0 })
	leader, err := cl.Campaign(context.Background(), "primary", "10.0.0.1:5432", redlockd.LockOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if now, err := cl.Leader(context.Background(), "primary"); err != nil || now.Term != leader.Term() {
		t.Fatalf("leader: %+v %v", now, err)
	}
	// An observer is told what it reads on each change; a change undone before its read
	// can go unseen, so each step waits for the observer to have seen the last.
	waitFor(t, "the observer to see the election", 5*time.Second, func() bool { return count() >= 2 })
	if err := leader.Proclaim(context.Background(), "10.0.0.1:5433"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the observer to see the proclaim", 5*time.Second, func() bool { return count() >= 3 })
	_ = leader.Release(context.Background())
	waitFor(t, "four events", 5*time.Second, func() bool { return count() >= 4 })
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("observe ended with %v", err)
	}
	kinds := []string{}
	for _, e := range events {
		kinds = append(kinds, e.Kind)
	}
	if strings.Join(kinds, ",") != "vacant,elected,proclaimed,vacant" || events[2].Value != "10.0.0.1:5433" ||
		events[1].Term != leader.Term() {
		t.Fatalf("events: %+v", events)
	}
	if now, _ := cl.Leader(context.Background(), "primary"); now != nil {
		t.Fatalf("vacant after resigning, got %+v", now)
	}
}

func TestTheCronExampleRunsOnce(t *testing.T) {
	c := startCluster(t, 1)
	cmd := exec.Command("go", "run", "./cron-once", "-instances", "8", "-tick", "t1")
	cmd.Dir = filepath.Join(projectRoot(t), "examples", "go")
	cmd.Env = append(os.Environ(), "REDLOCKD_SERVER="+c.urls()[0])
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 8 || strings.Count(string(out), "report sent") != 1 {
		t.Fatalf("one of eight runs it:\n%s", out)
	}
}

func TestEveryRequestCarriesTheCallersTraceContext(t *testing.T) {
	// A stand-in replica that records each request's headers and answers a lease.
	var mu sync.Mutex
	var seen []string
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.Header.Get("traceparent"))
		mu.Unlock()
		if r.Method == http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"name":"t","lease_id":"L1","fencing_token":7,"ttl_ms":30000,"validity_ms":29000,"expires_at":"2026-11-24T00:00:00.000Z"}`)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer replica.Close()
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	type traceKey struct{}
	c, err := redlockd.New(redlockd.Options{
		Servers: []string{replica.URL},
		Traceparent: func(ctx context.Context) string {
			s, _ := ctx.Value(traceKey{}).(string)
			return s
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(context.Background(), traceKey{}, parent)
	lease, err := c.Lock(ctx, "t", redlockd.LockOptions{NoAutoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(context.Background(), "t", redlockd.LockOptions{NoAutoRenew: true}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"POST " + parent, "DELETE " + parent, "POST "}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Fatalf("headers seen %q, want %q", seen, want)
	}
}

func TestAPermitIsALeaseOnOneOfLimitSlots(t *testing.T) {
	c := startCluster(t, 1)
	cl := client(t, c.urls()...)
	ctx := context.Background()
	lost := make(chan string, 1)
	first, err := cl.Permit(ctx, "db-pool", 2, redlockd.LockOptions{TTL: time.Second, Owner: "go-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)
	second, err := cl.Permit(ctx, "db-pool", 2, redlockd.LockOptions{
		TTL: time.Second, OnLost: func(l *redlockd.Lease) { lost <- l.LostReason() },
	})
	if err != nil {
		t.Fatal(err)
	}
	if first.Slot+second.Slot != 1 || first.Slot == second.Slot || first.Limit != 2 {
		t.Fatalf("slots %d and %d of %d", first.Slot, second.Slot, first.Limit)
	}
	if _, err := cl.Permit(ctx, "db-pool", 2, redlockd.LockOptions{TTL: time.Second}); !errors.Is(err, redlockd.ErrLockHeld) {
		t.Fatalf("a third permit of two: %v", err)
	}
	time.Sleep(3 * time.Second)
	if err := first.EnsureValid(0); err != nil {
		t.Fatalf("still valid after three TTLs: %v", err)
	}
	status, err := cl.Semaphore(ctx, "db-pool")
	if err != nil || len(status.Holders) != 2 || status.Holders[0].Slot != 0 || status.Holders[1].Slot != 1 {
		t.Fatalf("inspect: %+v %v", status, err)
	}
	if h := status.Holders[first.Slot]; h.FencingToken != first.FencingToken || h.Owner != "go-1" {
		t.Fatalf("first's slot shows %+v", h)
	}
	req, _ := http.NewRequest("DELETE", c.urls()[0]+"/semaphores/db-pool/leases/"+second.LeaseID, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 204 {
		t.Fatalf("release by id: %v %v", resp, err)
	}
	select {
	case reason := <-lost:
		if reason != "lease_not_found" {
			t.Fatalf("lost for %q", reason)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the released permit was not lost")
	}
}

func TestSharedLeasesHoldALockTogether(t *testing.T) {
	c := startCluster(t, 1)
	cl := client(t, c.urls()...)
	ctx := context.Background()
	var readers []*redlockd.Lease
	for _, owner := range []string{"reader-1", "reader-2"} {
		r, err := cl.Lock(ctx, "file", redlockd.LockOptions{TTL: time.Second, Shared: true, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		if r.Mode != "shared" {
			t.Fatalf("mode %q", r.Mode)
		}
		readers = append(readers, r)
	}
	if _, err := cl.Lock(ctx, "file", redlockd.LockOptions{TTL: time.Second}); !errors.Is(err, redlockd.ErrLockHeld) {
		t.Fatalf("an exclusive grant while shared: %v", err)
	}
	status, err := cl.Inspect(ctx, "file")
	if err != nil || status.Mode != "shared" || len(status.Holders) != 2 {
		t.Fatalf("inspect: %+v %v", status, err)
	}
	for _, r := range readers {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := cl.Lock(ctx, "file", redlockd.LockOptions{TTL: time.Second})
	if err != nil || w.Mode != "exclusive" || w.FencingToken <= readers[1].FencingToken {
		t.Fatalf("the writer after them: %+v %v", w, err)
	}
	w.Release(ctx)
}

func TestSeveralNamesAreOneLease(t *testing.T) {
	c := startCluster(t, 1)
	cl := client(t, c.urls()...)
	ctx := context.Background()
	one, err := cl.Lock(ctx, "acct:1", redlockd.LockOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LockMany(ctx, []string{"acct:2", "acct:1"}, redlockd.LockOptions{TTL: time.Second}); !errors.Is(err, redlockd.ErrLockHeld) {
		t.Fatalf("one of them held: %v", err)
	}
	one.Release(ctx)
	both, err := cl.LockMany(ctx, []string{"acct:2", "acct:1"}, redlockd.LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(both.Names) != 2 || both.Names[0] != "acct:1" || both.Names[1] != "acct:2" {
		t.Fatalf("names %v", both.Names)
	}
	time.Sleep(2500 * time.Millisecond)
	if err := both.EnsureValid(0); err != nil {
		t.Fatalf("renewed: %v", err)
	}
	if err := both.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if held(t, c.urls()[0], "acct:2")["held"] != false {
		t.Fatal("still held after release")
	}
}

func TestASessionRenewMarksAForceReleasedHoldLost(t *testing.T) {
	c := startCluster(t, 1)
	ctx := context.Background()
	cl := client(t, c.urls()...)
	session, err := cl.Session(ctx, redlockd.SessionOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer session.End(ctx)
	forced, err := session.Lock(ctx, "s:forced", redlockd.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := session.Lock(ctx, "s:kept", redlockd.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// An administrator takes the lock away: the next renew does not keep it.
	req, _ := http.NewRequest("DELETE", c.urls()[0]+"/locks/s:forced", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("force-release: %v %v", resp, err)
	}
	resp.Body.Close()
	// The renew that names it lost has its answer lost (sent past the client); the
	// client's own renew after it must still stop relying on the hold.
	req, _ = http.NewRequest("PUT", c.urls()[0]+"/sessions/"+session.ID, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("renew past the client: %v %v", resp, err)
	}
	resp.Body.Close()
	if err := session.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if forced.LostReason() != "lease_not_found" || forced.EnsureValid(0) == nil {
		t.Fatalf("a force-released hold is still relied on: %q", forced.LostReason())
	}
	if err := session.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kept.EnsureValid(0); err != nil {
		t.Fatalf("the other hold was not kept: %v", err)
	}
}

func TestASessionHoldsALockAPermitAndASharedLockWithOneHeartbeat(t *testing.T) {
	c := startCluster(t, 1)
	ctx := context.Background()
	cl := client(t, c.urls()...)
	session, err := cl.Session(ctx, redlockd.SessionOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := session.Lock(ctx, "s:lock", redlockd.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	permit, err := session.Permit(ctx, "s:pool", 1, redlockd.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shared, err := session.Lock(ctx, "s:doc", redlockd.LockOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // only the session is renewed
	for _, l := range []*redlockd.Lease{lock, permit, shared} {
		if err := l.EnsureValid(0); err != nil {
			t.Fatalf("%s lapsed while its session was renewed: %v", l.Name, err)
		}
	}
	if _, err := cl.Lock(ctx, "s:lock", redlockd.LockOptions{TTL: time.Second}); !errors.Is(err, redlockd.ErrLockHeld) {
		t.Fatalf("held through the session: %v", err)
	}
	if err := session.End(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"s:lock", "s:doc"} {
		if held(t, c.urls()[0], name)["held"] != false {
			t.Fatalf("%s still held after the session ended", name)
		}
	}
	if lock.Context().Err() == nil {
		t.Fatal("a hold's context ends with its session")
	}
}

func TestALockDelayRefusesTheNameAfterALapse(t *testing.T) {
	c := startCluster(t, 1)
	ctx := context.Background()
	cl := client(t, c.urls()...)
	if _, err := cl.Lock(ctx, "s:delay", redlockd.LockOptions{TTL: 300 * time.Millisecond, LockDelay: time.Second, NoAutoRenew: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for held(t, c.urls()[0], "s:delay")["held"] != false {
		if time.Now().After(deadline) {
			t.Fatal("the lease never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := cl.Lock(ctx, "s:delay", redlockd.LockOptions{TTL: time.Second})
	var e *redlockd.Error
	if !errors.As(err, &e) || e.Code != "lock_delay" || !errors.Is(err, redlockd.ErrLockHeld) {
		t.Fatalf("refused as delayed: %v", err)
	}
	after, err := cl.Lock(ctx, "s:delay", redlockd.LockOptions{TTL: time.Second, Wait: 2 * time.Second})
	if err != nil {
		t.Fatalf("granted once the delay ended: %v", err)
	}
	_ = after.Release(ctx)
}
