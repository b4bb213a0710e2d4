package redlockd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lease is a granted lock (or an election's leadership), renewed in the background at a
// third of its TTL until released. Its Context is cancelled when the lease ends: lost, or
// released. Safe for concurrent use.
type Lease struct {
	client *Client
	kind   string
	// Name is the lock's (or election's) name.
	Name string
	// LeaseID names the lease in renew and release; as secret as a password.
	LeaseID string
	// FencingToken is greater than every earlier grant's of this name: send it with each
	// protected write, and have the resource refuse a token lower than one it has seen.
	FencingToken uint64
	// Slot is which of a semaphore's Limit slots a permit holds (-1 for a lock's lease).
	Slot int
	// Limit is the limit a permit was granted with (0 for a lock's lease).
	Limit int
	// Mode is a lock's lease's: "exclusive" or "shared" ("" for other kinds).
	Mode string
	// Names are a lease's on several names: all of them, sorted (nil for one name).
	Names []string

	ctx    context.Context
	cancel context.CancelFunc
	onLost func(*Lease)
	jeopardy

	mu         sync.Mutex
	ttl        time.Duration
	owner      string
	validUntil time.Time
	lost       string
	released   bool
	stop       chan struct{}
	// joined is when a session took this hold: a session renew sent before then does not
	// judge it.
	joined time.Time
}

func newLease(c *Client, kind string, b leaseBody, sent time.Time, opts LockOptions) *Lease {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lease{
		client: c, kind: kind, Name: b.Name, LeaseID: b.LeaseID,
		ctx: ctx, cancel: cancel, onLost: opts.OnLost,
		ttl:        time.Duration(b.TTLMs) * time.Millisecond,
		validUntil: sent.Add(time.Duration(b.ValidityMs) * time.Millisecond),
		stop:       make(chan struct{}),
		Slot:       -1,
		Limit:      b.Limit,
		Mode:       b.Mode,
		Names:      b.Names,
	}
	if b.Slot != nil {
		l.Slot = *b.Slot
	}
	if b.FencingToken != nil {
		l.FencingToken = *b.FencingToken
	} else if b.Term != nil {
		l.FencingToken = *b.Term
	}
	l.owner = b.Owner
	if kind == "elections" {
		l.owner = b.Value
	}
	if !opts.NoAutoRenew {
		go l.renewLoop()
	}
	return l
}

// Term is an election's term: its lease's fencing token.
func (l *Lease) Term() uint64 { return l.FencingToken }

// Owner is the lease's owner text (an election's value).
func (l *Lease) Owner() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.owner
}

// Context is cancelled when the lease ends (lost or released): pass it to the protected
// work.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is closed when the lease ends.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Remaining is how long the lease may still be relied on (0 once lost).
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != "" {
		return 0
	}
	if left := time.Until(l.validUntil); left > 0 {
		return left
	}
	return 0
}

// LostReason is why the lease was lost ("expired", "lease_not_found"), or "".
func (l *Lease) LostReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// EnsureValid returns an error wrapping ErrLeaseLost unless the lease is still valid for
// margin more. Call it right before each protected write.
func (l *Lease) EnsureValid(margin time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != "" {
		return &Error{Kind: ErrLeaseLost, Code: l.lost, Message: fmt.Sprintf("lease of %s lost: %s", l.Name, l.lost)}
	}
	if !time.Now().Add(margin).Before(l.validUntil) {
		return &Error{Kind: ErrLeaseLost, Code: "expired", Message: fmt.Sprintf("lease of %s has no validity left", l.Name)}
	}
	return nil
}

// Renew renews now (the lease does this on its own).
func (l *Lease) Renew(ctx context.Context) error { return l.renew(ctx, nil) }

// Proclaim publishes an elected leader's new value; the term stays.
func (l *Lease) Proclaim(ctx context.Context, value string) error { return l.renew(ctx, &value) }

func (l *Lease) renew(ctx context.Context, value *string) error {
	body := map[string]any{}
	if value != nil {
		body["value"] = *value
	}
	sent := time.Now()
	l.mu.Lock()
	timeout := l.renewTimeout(l.ttl, l.validUntil, sent, l.client.timeout)
	l.mu.Unlock()
	var answer leaseBody
	err := l.client.renewCall(ctx, path(l.kind, l.Name, l.LeaseID), body, timeout, &answer)
	if errors.Is(err, ErrLeaseLost) {
		l.lose("lease_not_found")
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if until := sent.Add(time.Duration(answer.ValidityMs) * time.Millisecond); until.After(l.validUntil) {
		l.validUntil = until
	}
	l.ttl = time.Duration(answer.TTLMs) * time.Millisecond
	if l.kind == "elections" && answer.Value != "" {
		l.owner = answer.Value
	} else if answer.Owner != "" {
		l.owner = answer.Owner
	}
	return nil
}

// Release stops renewing and lets go of the lock; a lease already gone is not an error.
// Call it with defer: it releases on a panic too.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	close(l.stop)
	l.mu.Unlock()
	defer l.cancel()
	err := l.client.call(ctx, "DELETE", path(l.kind, l.Name, l.LeaseID), nil, "", 0, nil)
	if errors.Is(err, ErrLeaseLost) {
		return nil
	}
	return err
}

func (l *Lease) lose(reason string) {
	l.mu.Lock()
	if l.lost != "" || l.released {
		l.mu.Unlock()
		return
	}
	l.lost = reason
	l.mu.Unlock()
	l.cancel()
	if l.onLost != nil {
		l.onLost(l)
	}
}

func (l *Lease) renewLoop() {
	l.mu.Lock()
	delay := l.ttl / 3
	l.mu.Unlock()
	for {
		// Wake at the end of the validity at the latest, to signal the loss on time.
		if left := time.Until(l.validUntilNow()); left < delay {
			delay = left
		}
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-time.After(delay):
		}
		err := l.renew(l.ctx, nil)
		l.mu.Lock()
		ttl := l.ttl
		l.mu.Unlock()
		switch {
		case err == nil:
			delay = ttl / 3
			l.renewed(l.client, l)
		case errors.Is(err, ErrLeaseLost), l.ctx.Err() != nil:
			return
		default:
			delay = ttl / 10
			if delay < 10*time.Millisecond {
				delay = 10 * time.Millisecond
			}
			delay = jittered(delay)
		}
		until := l.validUntilNow()
		if !time.Now().Before(until) {
			l.lose("expired")
			return
		}
		delay = l.check(l.client, l, ttl, until, delay)
	}
}

func (l *Lease) validUntilNow() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}
