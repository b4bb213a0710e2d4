package redlockd

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The kinds of failure a caller handles differently; test with errors.Is.
var (
	// ErrLockHeld: another lease holds the lock (after Wait, if any). The *Error's
	// RetryAfter says when the holder's lease lapses unless renewed.
	ErrLockHeld = errors.New("lock held")
	// ErrUnavailable: no replica could reach a majority of masters, or none answered: the
	// lock's state is unknown. Not "held": try later.
	ErrUnavailable = errors.New("unavailable")
	// ErrLeaseLost: the lease protects nothing any more (revoked, expired, or its validity
	// ran out before a renew succeeded). Stop the protected work.
	ErrLeaseLost = errors.New("lease lost")
	// ErrBadRequest: the request is wrong (a bad name or TTL, an Idempotency-Key reused
	// for another request); retrying it as is will not help.
	ErrBadRequest = errors.New("bad request")
	// ErrUnauthorized: no token, or an unknown one (401). A 403 is ErrForbidden, which
	// errors.Is also reports as ErrUnauthorized.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: the token is known, but its role or name prefixes do not allow this
	// (403).
	ErrForbidden = errors.New("forbidden")
	// ErrTooManyRequests: past a server cap or the token's rate (429).
	ErrTooManyRequests = errors.New("too many requests")
)

// Error is what the client returns for an answer that is not a success, or for no answer.
type Error struct {
	Kind error
	// Code is the contract's error code, or "network" when no server answered.
	Code string
	// Status is the HTTP status, 0 without one.
	Status     int
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("redlockd: %v: %s", e.Kind, e.Message)
	}
	return fmt.Sprintf("redlockd: %s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Kind }

// Is reports a 403 (ErrForbidden) as an ErrUnauthorized too, so that a check for either
// catches it.
func (e *Error) Is(target error) bool {
	return target == ErrUnauthorized && e.Kind == ErrForbidden
}

type errorBody struct {
	Error        string `json:"error"`
	Message      string `json:"message"`
	RetryAfterMs *int64 `json:"retry_after_ms"`
}

func errorFrom(status int, body errorBody, retryAfterHeader string) *Error {
	e := &Error{Code: body.Error, Status: status, Message: body.Message}
	if e.Message == "" {
		e.Message = fmt.Sprintf("HTTP %d", status)
	}
	if body.RetryAfterMs != nil {
		e.RetryAfter = time.Duration(*body.RetryAfterMs) * time.Millisecond
	}
	switch {
	case status == 409:
		e.Kind = ErrLockHeld
	case status == 404 && (body.Error == "lease_not_found" || body.Error == "session_not_found"):
		e.Kind = ErrLeaseLost
	case status == 401:
		e.Kind = ErrUnauthorized
	case status == 403:
		e.Kind = ErrForbidden
	case status == 429:
		e.Kind = ErrTooManyRequests
		if secs, err := strconv.Atoi(retryAfterHeader); err == nil {
			e.RetryAfter = time.Duration(secs) * time.Second
		}
	case status == 408 || status == 503:
		// 408: the body did not reach the server in time; another try (or replica) may.
		e.Kind = ErrUnavailable
	case status >= 400 && status < 500:
		e.Kind = ErrBadRequest
	default:
		e.Kind = ErrUnavailable
	}
	return e
}
