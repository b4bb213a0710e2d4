// Package redlockd is a client for redlockd, the distributed-lock service: leases renewed
// in the background, a context cancelled when a lease is lost, fencing tokens, and grants
// that are safe to retry. Standard library only.
//
//	client, _ := redlockd.New(redlockd.Options{Servers: []string{"http://127.0.0.1:8080"}})
//	lease, err := client.Lock(ctx, "nightly-report", redlockd.LockOptions{TTL: 30 * time.Second})
//	if err != nil { return err }
//	defer lease.Release(context.Background())
//	return sendReport(lease.Context(), lease.FencingToken)
package redlockd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// rounds is how many times a request goes round the servers before giving up.
const rounds = 2

// Options configure a Client.
type Options struct {
	// Servers are the replicas' base URLs; requests fail over between them.
	Servers []string
	// Token is a bearer token, when the servers require one.
	Token string
	// Timeout bounds one request, besides a grant's own Wait. Default 5 s. A renew (every
	// replica it tries, together) is also cut short at the jeopardy point and at the end
	// of the validity, so that a replica that stops answering cannot hold back OnJeopardy
	// or the loss.
	Timeout time.Duration
	// HTTPClient, if set, is used for every request. (An OpenTelemetry transport, such
	// as otelhttp's, propagates the caller's trace by itself.)
	HTTPClient *http.Client
	// Traceparent, if set, gives the caller's trace for each request as a W3C
	// traceparent ("" for none), from the request's context: redlockd's spans join it.
	Traceparent func(ctx context.Context) string
	// OnJeopardy, if set, is called once, from the renewing goroutine, when the renews of
	// a lease or session this client renews have not got through and less than a third of
	// its TTL is left (its InJeopardy is then true): stop what it guards unless OnSafe
	// comes first, when a renew gets through again. held is a *Lease or a *Session.
	OnJeopardy func(held Held, left time.Duration)
	// OnSafe, if set, is called when a renew gets through after OnJeopardy.
	OnSafe func(held Held)
}

// Held is a *Lease or a *Session: what OnJeopardy and OnSafe are told about.
type Held interface {
	// InJeopardy is whether renews have not got through and less than a third of the TTL
	// is left.
	InJeopardy() bool
}

// Client talks to one or more redlockd replicas. Safe for concurrent use.
type Client struct {
	servers    []string
	token      string
	timeout    time.Duration
	http       *http.Client
	trace      func(ctx context.Context) string
	mu         sync.Mutex
	preferred  int
	onJeopardy func(Held, time.Duration)
	onSafe     func(Held)
}

// New returns a client for opts.Servers.
func New(opts Options) (*Client, error) {
	c := &Client{token: opts.Token, timeout: opts.Timeout, http: opts.HTTPClient, trace: opts.Traceparent,
		onJeopardy: opts.OnJeopardy, onSafe: opts.OnSafe}
	for _, s := range opts.Servers {
		for _, u := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
			c.servers = append(c.servers, strings.TrimRight(u, "/"))
		}
	}
	if len(c.servers) == 0 {
		return nil, errors.New("redlockd: at least one server URL is required")
	}
	if c.timeout == 0 {
		c.timeout = 5 * time.Second
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	return c, nil
}

// LockOptions are a grant's parameters.
type LockOptions struct {
	// TTL of the lease; default 30 s (10 s for a campaign).
	TTL time.Duration
	// Wait is how long to wait while another lease holds the lock.
	Wait time.Duration
	// Owner is shown by inspect (for a campaign: the leader's value).
	Owner string
	// IdempotencyKey is sent with the grant and each retry of it; default: random.
	IdempotencyKey string
	// OnLost is called once, from the renewing goroutine, when the lease is lost.
	OnLost func(*Lease)
	// NoAutoRenew leaves renewing to the caller.
	NoAutoRenew bool
	// Shared holds a lock together with other shared holders (an exclusive grant waits
	// for them all); for Lock only.
	Shared bool
	// LockDelay: when the lease ends other than by its Release (it expires, or is
	// force-released), nobody gets the name until this long after; for Lock only.
	LockDelay time.Duration

	// limit is a semaphore's (set by Permit).
	limit int
	// names are a lease's on several names (set by LockMany).
	names []string
	// session is the session the hold is made through (set by Session's methods).
	session string
}

// Lock grants name, waiting up to opts.Wait while another lease holds it. Errors wrap
// ErrLockHeld, ErrUnavailable, ErrBadRequest or ErrUnauthorized. The grant carries an
// Idempotency-Key, so that a retry after a lost answer gets the same lease.
func (c *Client) Lock(ctx context.Context, name string, opts LockOptions) (*Lease, error) {
	return c.grant(ctx, "locks", name, opts)
}

// LockMany takes every one of names under one lease, or none (in any order: the server
// orders them, so two callers never deadlock); the lease is renewed, signalled and
// released as one lock's, and its Names lists them. Errors wrap ErrLockHeld while any is
// held past opts.Wait.
func (c *Client) LockMany(ctx context.Context, names []string, opts LockOptions) (*Lease, error) {
	opts.names = names
	return c.grant(ctx, "locks", "", opts)
}

// Permit takes one of limit permits of semaphore name, renewed and signalled like a
// lock's lease: Slot says which of the limit slots it holds, and its FencingToken rises per
// slot. Errors wrap ErrLockHeld when every permit is taken for the whole opts.Wait.
func (c *Client) Permit(ctx context.Context, name string, limit int, opts LockOptions) (*Lease, error) {
	opts.limit = limit
	return c.grant(ctx, "semaphores", name, opts)
}

// PermitHolder is one permit of a semaphore as inspect answers it; never a lease id.
type PermitHolder struct {
	Slot           int    `json:"slot"`
	FencingToken   uint64 `json:"fencing_token"`
	TTLRemainingMs int64  `json:"ttl_remaining_ms"`
	Owner          string `json:"owner"`
}

// SemaphoreStatus is a semaphore's permits held now, by slot.
type SemaphoreStatus struct {
	Name    string         `json:"name"`
	Holders []PermitHolder `json:"holders"`
}

// Semaphore returns the permits of semaphore name held now.
func (c *Client) Semaphore(ctx context.Context, name string) (SemaphoreStatus, error) {
	var status SemaphoreStatus
	err := c.call(ctx, "GET", path("semaphores", name, ""), nil, "", 0, &status)
	return status, err
}

// Campaign makes this caller leader of election name with value; the lease's Term is its
// fencing token, and Proclaim publishes a new value.
func (c *Client) Campaign(ctx context.Context, name, value string, opts LockOptions) (*Lease, error) {
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	opts.Owner = value
	return c.grant(ctx, "elections", name, opts)
}

// Leader is who leads an election now.
type Leader struct {
	Name         string
	Term         uint64
	Value        string
	TTLRemaining time.Duration
}

// Leader returns who leads name now, or nil when it is vacant.
func (c *Client) Leader(ctx context.Context, name string) (*Leader, error) {
	var body struct {
		Name           string `json:"name"`
		Vacant         bool   `json:"vacant"`
		Term           uint64 `json:"term"`
		Value          string `json:"value"`
		TTLRemainingMs int64  `json:"ttl_remaining_ms"`
	}
	if err := c.call(ctx, "GET", path("elections", name, ""), nil, "", 0, &body); err != nil {
		return nil, err
	}
	if body.Vacant {
		return nil, nil
	}
	return &Leader{body.Name, body.Term, body.Value, time.Duration(body.TTLRemainingMs) * time.Millisecond}, nil
}

// LeaderEvent is one change an observer is told of: "elected" (a new term), "proclaimed"
// (the leader's new value, same term) or "vacant" (Term is the last leader's, if known).
type LeaderEvent struct {
	Kind  string
	Name  string `json:"name"`
	Term  uint64 `json:"term"`
	Value string `json:"value"`
}

// Observe calls fn with every change of name's leadership, starting with the current
// state, until ctx is done (it then returns ctx.Err()). It reconnects, to another replica
// if need be, when a stream ends, and is told the current state again then.
func (c *Client) Observe(ctx context.Context, name string, fn func(LeaderEvent)) error {
	failures := 0
	for {
		for _, base := range c.order() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := c.observeOnce(ctx, base, name, fn); err != nil {
				var e *Error
				if errors.As(err, &e) && !errors.Is(err, ErrUnavailable) {
					return err
				}
				failures++
			} else {
				failures = 0
			}
		}
		pause := jittered(50 * time.Millisecond << min(failures, 5))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

func (c *Client) observeOnce(ctx context.Context, base, name string, fn func(LeaderEvent)) error {
	req, err := http.NewRequestWithContext(ctx, "GET", base+path("elections", name, "")+"/observe", nil)
	if err != nil {
		return err
	}
	c.setHeaders(req, "", false)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readError(resp)
	}
	c.answered(base)
	return readEvents(resp.Body, func(event string, data json.RawMessage) {
		// "closed": the replica is stopping and the stream ends; the caller reconnects.
		if event == "closed" {
			return
		}
		ev := LeaderEvent{Kind: event}
		if json.Unmarshal(data, &ev) == nil {
			fn(ev)
		}
	})
}

// readEvents reads server-sent events from r until it ends, calling fn with each event's
// name and its JSON data (the table every client shares: clients/cases/sse.json). An event
// without data, or whose data is not JSON, is not one of ours and is skipped.
func readEvents(r io.Reader, fn func(event string, data json.RawMessage)) error {
	scanner := bufio.NewScanner(r)
	// A line may be longer than the scanner's default 64 KiB (a lease on many names).
	scanner.Buffer(make([]byte, 0, 64*1024), 1<<20)
	event, data := "message", []string{}
	for scanner.Scan() {
		line := strings.TrimSuffix(scanner.Text(), "\r")
		switch {
		case line == "":
			joined := []byte(strings.Join(data, "\n"))
			if len(data) > 0 && json.Valid(joined) {
				fn(event, joined)
			}
			event, data = "message", data[:0]
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimLeft(line[5:], " "))
		}
	}
	return scanner.Err()
}

// RunOncePerTick runs fn on this instance only if no other runs it this tick: it takes
// name without waiting, runs fn, and keeps the lock holdAtLeast after the grant, so that
// instances whose clocks fire a little later find it held. ran is false when another
// instance had it. fn's context is the lease's: cancelled if the lease is lost.
func (c *Client) RunOncePerTick(ctx context.Context, name string, holdAtLeast, ttl time.Duration,
	fn func(ctx context.Context, lease *Lease) error) (ran bool, err error) {
	if ttl == 0 {
		ttl = 2 * holdAtLeast
		if ttl < time.Second {
			ttl = time.Second
		}
	}
	lease, err := c.Lock(ctx, name, LockOptions{TTL: ttl})
	if errors.Is(err, ErrLockHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer lease.Release(context.Background())
	granted := time.Now()
	if err := fn(lease.Context(), lease); err != nil {
		return true, err
	}
	select {
	case <-time.After(holdAtLeast - time.Since(granted)):
	case <-lease.Done():
	case <-ctx.Done():
	}
	return true, nil
}

// LockStatus is a lock's state as inspect answers it; it never names a lease id.
type LockStatus struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// FencingToken is the holder's token, 0 when nobody holds the lock.
	FencingToken uint64 `json:"fencing_token"`
	// TTLRemainingMs is what is left of the holder's lease, in ms.
	TTLRemainingMs int64  `json:"ttl_remaining_ms"`
	Owner          string `json:"owner"`
	// Mode is how it is held, when held: "exclusive" or "shared".
	Mode string `json:"mode"`
	// Holders are a shared lock's holders.
	Holders []SharedHolder `json:"holders"`
}

// SharedHolder is one shared holder of a lock, as inspect answers it; never a lease id.
type SharedHolder struct {
	FencingToken   uint64 `json:"fencing_token"`
	TTLRemainingMs int64  `json:"ttl_remaining_ms"`
	Owner          string `json:"owner"`
}

// TTLRemaining is what is left of the holder's lease.
func (s LockStatus) TTLRemaining() time.Duration {
	return time.Duration(s.TTLRemainingMs) * time.Millisecond
}

// Inspect returns the lock's state: who holds it, if anyone.
func (c *Client) Inspect(ctx context.Context, name string) (LockStatus, error) {
	var status LockStatus
	err := c.call(ctx, "GET", path("locks", name, ""), nil, "", 0, &status)
	return status, err
}

type leaseBody struct {
	Name         string   `json:"name"`
	LeaseID      string   `json:"lease_id"`
	FencingToken *uint64  `json:"fencing_token"`
	Term         *uint64  `json:"term"`
	TTLMs        int64    `json:"ttl_ms"`
	ValidityMs   int64    `json:"validity_ms"`
	Owner        string   `json:"owner"`
	Value        string   `json:"value"`
	Slot         *int     `json:"slot"`
	Limit        int      `json:"limit"`
	Mode         string   `json:"mode"`
	Names        []string `json:"names"`
}

func (c *Client) grant(ctx context.Context, kind, name string, opts LockOptions) (*Lease, error) {
	if opts.TTL == 0 {
		opts.TTL = 30 * time.Second
	}
	body := map[string]any{"ttl_ms": opts.TTL.Milliseconds(), "wait_ms": opts.Wait.Milliseconds()}
	if opts.Owner != "" {
		if kind == "elections" {
			body["value"] = opts.Owner
		} else {
			body["owner"] = opts.Owner
		}
	}
	if opts.limit > 0 {
		body["limit"] = opts.limit
	}
	if opts.Shared && kind == "locks" {
		body["mode"] = "shared"
	}
	if opts.LockDelay > 0 && kind == "locks" {
		body["lock_delay_ms"] = opts.LockDelay.Milliseconds()
	}
	if opts.session != "" {
		// A hold through a session lives as long as the session: no TTL of its own.
		delete(body, "ttl_ms")
		body["session"] = opts.session
		opts.NoAutoRenew = true
	}
	route := path(kind, name, "")
	if len(opts.names) > 0 {
		body["names"] = opts.names
		route = "/locks"
	}
	key := opts.IdempotencyKey
	if key == "" {
		key = newKey()
	}
	sent := time.Now()
	var answer leaseBody
	if err := c.call(ctx, "POST", route, body, key, c.timeout+opts.Wait, &answer); err != nil {
		return nil, err
	}
	return newLease(c, kind, answer, sent, opts), nil
}

// call makes one request, trying each replica in turn while none answers or a replica
// cannot reach a majority (503). Only requests that are safe to repeat come here: renews
// and releases name their lease, and grants carry an Idempotency-Key.
func (c *Client) call(ctx context.Context, method, route string, body any, key string,
	timeout time.Duration, out any) error {
	if timeout <= 0 {
		timeout = c.timeout
	}
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	var last error
	for round := 0; round < rounds; round++ {
		for _, base := range c.order() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			resp, err := c.do(ctx, method, base+route, payload, key, timeout)
			if err != nil {
				last = &Error{Kind: ErrUnavailable, Code: "network", Message: fmt.Sprintf("%s: %v", base, err)}
				continue
			}
			if resp.StatusCode == http.StatusServiceUnavailable {
				last = readError(resp)
				continue
			}
			c.answered(base)
			if resp.StatusCode >= 400 {
				return readError(resp)
			}
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				last = &Error{Kind: ErrUnavailable, Code: "network", Message: err.Error()}
				continue
			}
			if out != nil && len(raw) > 0 {
				if err := json.Unmarshal(raw, out); err != nil {
					// Not the contract's answer (a proxy's page, say): the lock's state is
					// unknown, as with no answer.
					return &Error{Kind: ErrUnavailable, Code: "bad_answer", Status: resp.StatusCode,
						Message: fmt.Sprintf("%s answered %d with a body that is not the contract's: %v", base, resp.StatusCode, err)}
				}
			}
			return nil
		}
	}
	return last
}

func (c *Client) do(ctx context.Context, method, u string, payload []byte, key string,
	timeout time.Duration) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	var reader io.Reader
	if payload != nil {
		reader = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, reader)
	if err != nil {
		cancel()
		return nil, err
	}
	c.setHeaders(req, key, payload != nil)
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{resp.Body, cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (c *Client) setHeaders(req *http.Request, key string, json bool) {
	req.Header.Set("Accept", "application/json")
	if json {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if c.trace != nil {
		if parent := c.trace(req.Context()); parent != "" {
			req.Header.Set("traceparent", parent)
		}
	}
}

func (c *Client) order() []string {
	c.mu.Lock()
	start := c.preferred
	c.mu.Unlock()
	out := make([]string, len(c.servers))
	for i := range c.servers {
		out[i] = c.servers[(start+i)%len(c.servers)]
	}
	return out
}

func (c *Client) answered(base string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.servers {
		if s == base {
			c.preferred = i
		}
	}
}

func readError(resp *http.Response) *Error {
	defer resp.Body.Close()
	var body errorBody
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &body)
	return errorFrom(resp.StatusCode, body, resp.Header.Get("Retry-After"))
}

func path(kind, name, leaseID string) string {
	p := "/" + kind + "/" + url.PathEscape(name)
	if leaseID != "" {
		p += "/leases/" + url.PathEscape(leaseID)
	}
	return p
}

func newKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// jeopardy is the warning a lease and a session share: a healthy hold is renewed with two
// thirds of its TTL left, so one with less than a third left has seen its renews fail for
// a while. Told once, until a renew gets through.
type jeopardy struct {
	mu     sync.Mutex
	warned bool
}

// InJeopardy is whether renews have not got through and less than a third of the TTL is
// left (the client's OnJeopardy was called; false again once OnSafe is).
func (j *jeopardy) InJeopardy() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.warned
}

// renewed tells held it is safe when it had been warned.
func (j *jeopardy) renewed(c *Client, held Held) {
	j.mu.Lock()
	was := j.warned
	j.warned = false
	j.mu.Unlock()
	if was && c.onSafe != nil {
		c.onSafe(held)
	}
}

// renewTimeout is how long a renew sent at now may wait for its answer, all replicas it
// tries together: at most most (the client's timeout), and no longer than until the next
// thing the renew loop must tell: the jeopardy point (a third of ttl before until) while
// not yet warned, then until itself. A renew that hangs (its replica stopped answering)
// then fails in time for both.
func (j *jeopardy) renewTimeout(ttl time.Duration, until, now time.Time, most time.Duration) time.Duration {
	j.mu.Lock()
	warned := j.warned
	j.mu.Unlock()
	left := until.Sub(now)
	if due := until.Add(-ttl / 3).Sub(now); !warned && due > 0 {
		left = due
	}
	if left < most {
		most = left
	}
	if most < 50*time.Millisecond {
		most = 50 * time.Millisecond
	}
	return most
}

// renewCall is one renew's call of route, within timeout for all the replicas it tries;
// its running out is the replicas' failure to answer in time, not the caller's context.
func (c *Client) renewCall(ctx context.Context, route string, body any, timeout time.Duration, out any) error {
	within, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := c.call(within, "PUT", route, body, "", timeout, out)
	if err != nil && ctx.Err() == nil && within.Err() != nil && !errors.Is(err, ErrLeaseLost) {
		return &Error{Kind: ErrUnavailable, Code: "timeout",
			Message: fmt.Sprintf("no replica answered the renew within %v: %v", timeout, err)}
	}
	return err
}

// check warns held when less than a third of ttl is left before until, once; otherwise it
// returns delay, shortened to when the warning falls due.
func (j *jeopardy) check(c *Client, held Held, ttl time.Duration, until time.Time, delay time.Duration) time.Duration {
	j.mu.Lock()
	if j.warned {
		j.mu.Unlock()
		return delay
	}
	due := time.Until(until.Add(-ttl / 3))
	if due > 0 {
		j.mu.Unlock()
		if due < delay {
			return due
		}
		return delay
	}
	j.warned = true
	j.mu.Unlock()
	if c.onJeopardy != nil {
		c.onJeopardy(held, time.Until(until))
	}
	return delay
}
