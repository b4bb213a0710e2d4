package redlockd

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"time"
)

// Session is one heartbeat for many holds: renewed in the background at a third of its TTL
// until ended, and every lock, permit and term taken through it (its Lock, Permit, LockMany
// and Campaign) is valid as long as the session is, with no renew of its own. Its Context
// is cancelled when the session ends (lost, or ended), and its holds are lost with it. End
// it with defer: ending it releases every hold at once. Safe for concurrent use.
type Session struct {
	client *Client
	// ID names the session in renew and end, and in grants through it; as secret as a
	// password.
	ID string

	ctx    context.Context
	cancel context.CancelFunc
	onLost func(*Session)
	jeopardy

	mu         sync.Mutex
	ttl        time.Duration
	validUntil time.Time
	lost       string
	ended      bool
	holds      []*Lease
	stop       chan struct{}
}

// SessionOptions are a session's parameters.
type SessionOptions struct {
	// TTL of the session; default 30 s.
	TTL time.Duration
	// Owner is free text naming the holder.
	Owner string
	// OnLost is called once, from the renewing goroutine, when the session is lost.
	OnLost func(*Session)
}

type sessionBody struct {
	SessionID  string `json:"session_id"`
	TTLMs      int64  `json:"ttl_ms"`
	ValidityMs int64  `json:"validity_ms"`
	// Kept, Unconfirmed and Lost come with a renew (see Renew).
	Kept        []string `json:"kept"`
	Unconfirmed []string `json:"unconfirmed"`
	Lost        []string `json:"lost"`
}

// Session opens a session.
func (c *Client) Session(ctx context.Context, opts SessionOptions) (*Session, error) {
	if opts.TTL == 0 {
		opts.TTL = 30 * time.Second
	}
	body := map[string]any{"ttl_ms": opts.TTL.Milliseconds()}
	if opts.Owner != "" {
		body["owner"] = opts.Owner
	}
	sent := time.Now()
	var answer sessionBody
	if err := c.call(ctx, "POST", "/sessions", body, "", c.timeout, &answer); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Session{
		client: c, ID: answer.SessionID, ctx: sctx, cancel: cancel, onLost: opts.OnLost,
		ttl:        time.Duration(answer.TTLMs) * time.Millisecond,
		validUntil: sent.Add(time.Duration(answer.ValidityMs) * time.Millisecond),
		stop:       make(chan struct{}),
	}
	go s.renewLoop()
	return s, nil
}

// Lock grants name through the session (opts.TTL and renewing do not apply).
func (s *Session) Lock(ctx context.Context, name string, opts LockOptions) (*Lease, error) {
	opts.session = s.ID
	return s.hold(s.client.grant(ctx, "locks", name, opts))
}

// Permit takes one of limit permits of semaphore name through the session.
func (s *Session) Permit(ctx context.Context, name string, limit int, opts LockOptions) (*Lease, error) {
	opts.session, opts.limit = s.ID, limit
	return s.hold(s.client.grant(ctx, "semaphores", name, opts))
}

// LockMany takes every one of names under one lease through the session.
func (s *Session) LockMany(ctx context.Context, names []string, opts LockOptions) (*Lease, error) {
	opts.session, opts.names = s.ID, names
	return s.hold(s.client.grant(ctx, "locks", "", opts))
}

// Campaign becomes leader of election name through the session.
func (s *Session) Campaign(ctx context.Context, name, value string, opts LockOptions) (*Lease, error) {
	opts.session, opts.Owner = s.ID, value
	return s.hold(s.client.grant(ctx, "elections", name, opts))
}

func (s *Session) hold(l *Lease, err error) (*Lease, error) {
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.joined = time.Now()
	l.mu.Unlock()
	s.mu.Lock()
	s.holds = append(s.holds, l)
	s.mu.Unlock()
	return l, nil
}

// Context is cancelled when the session ends (lost or ended).
func (s *Session) Context() context.Context { return s.ctx }

// LostReason is why the session was lost ("expired", "session_not_found"), or "".
func (s *Session) LostReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// Remaining is how long the session (and every hold through it) may still be relied on.
func (s *Session) Remaining() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost != "" {
		return 0
	}
	if left := time.Until(s.validUntil); left > 0 {
		return left
	}
	return 0
}

func (s *Session) route() string { return "/sessions/" + url.PathEscape(s.ID) }

// Renew renews the session, and every hold through it, now (it does this on its own).
func (s *Session) Renew(ctx context.Context) error {
	sent := time.Now()
	s.mu.Lock()
	timeout := s.renewTimeout(s.ttl, s.validUntil, sent, s.client.timeout)
	s.mu.Unlock()
	var answer sessionBody
	err := s.client.renewCall(ctx, s.route(), map[string]any{}, timeout, &answer)
	if errors.Is(err, ErrLeaseLost) {
		s.lose("session_not_found")
	}
	if err != nil {
		return err
	}
	// Only the holds the answer lists in Kept are valid as long as the session now; those
	// it lists as Unconfirmed keep the validity they had (a master that carries them did
	// not answer) and are lost once it runs out; any other hold taken before the renew was
	// sent has ended. A hold granted while the renew was under way is judged by the next.
	kept, unconfirmed := map[string]bool{}, map[string]bool{}
	for _, id := range answer.Kept {
		kept[id] = true
	}
	for _, id := range answer.Unconfirmed {
		unconfirmed[id] = true
	}
	type loss struct {
		lease  *Lease
		reason string
	}
	now := time.Now()
	s.mu.Lock()
	if until := sent.Add(time.Duration(answer.ValidityMs) * time.Millisecond); until.After(s.validUntil) {
		s.validUntil = until
	}
	s.ttl = time.Duration(answer.TTLMs) * time.Millisecond
	held, lost := s.holds[:0], []loss{}
	for _, h := range s.holds {
		h.mu.Lock()
		switch {
		case h.joined.After(sent):
		case kept[h.LeaseID]:
			if s.validUntil.After(h.validUntil) {
				h.validUntil = s.validUntil
			}
		case !unconfirmed[h.LeaseID]:
			lost = append(lost, loss{h, "lease_not_found"})
		case !h.validUntil.After(now):
			lost = append(lost, loss{h, "quorum_lost"})
		}
		h.mu.Unlock()
		if len(lost) == 0 || lost[len(lost)-1].lease != h {
			held = append(held, h)
		}
	}
	s.holds = held
	s.mu.Unlock()
	for _, l := range lost {
		l.lease.lose(l.reason)
	}
	return nil
}

// End ends the session: every hold through it is released. A session already gone is
// not an error. Call it with defer.
func (s *Session) End(ctx context.Context) error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return nil
	}
	s.ended = true
	close(s.stop)
	holds := s.holds
	s.mu.Unlock()
	for _, h := range holds {
		h.mu.Lock()
		h.released = true
		h.mu.Unlock()
		h.cancel()
	}
	defer s.cancel()
	err := s.client.call(ctx, "DELETE", s.route(), nil, "", 0, nil)
	if errors.Is(err, ErrLeaseLost) {
		return nil
	}
	return err
}

func (s *Session) lose(reason string) {
	s.mu.Lock()
	if s.lost != "" || s.ended {
		s.mu.Unlock()
		return
	}
	s.lost = reason
	holds := s.holds
	s.mu.Unlock()
	for _, h := range holds {
		h.lose(reason)
	}
	s.cancel()
	if s.onLost != nil {
		s.onLost(s)
	}
}

func (s *Session) validUntilNow() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.validUntil
}

func (s *Session) renewLoop() {
	s.mu.Lock()
	delay := s.ttl / 3
	s.mu.Unlock()
	for {
		if left := time.Until(s.validUntilNow()); left < delay {
			delay = left
		}
		select {
		case <-s.stop:
			return
		case <-s.ctx.Done():
			return
		case <-time.After(delay):
		}
		err := s.Renew(s.ctx)
		s.mu.Lock()
		ttl := s.ttl
		s.mu.Unlock()
		switch {
		case err == nil:
			delay = ttl / 3
			s.renewed(s.client, s)
		case errors.Is(err, ErrLeaseLost), s.ctx.Err() != nil:
			return
		default:
			delay = ttl / 10
			if delay < 10*time.Millisecond {
				delay = 10 * time.Millisecond
			}
			delay = jittered(delay)
		}
		until := s.validUntilNow()
		if !time.Now().Before(until) {
			s.lose("expired")
			return
		}
		delay = s.check(s.client, s, ttl, until, delay)
	}
}
