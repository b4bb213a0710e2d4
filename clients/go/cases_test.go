package redlockd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// errorKinds names each class of the shared tables (clients/cases/) by its error kind.
var errorKinds = map[string]error{
	"held":              ErrLockHeld,
	"lease_lost":        ErrLeaseLost,
	"bad_request":       ErrBadRequest,
	"unauthorized":      ErrUnauthorized,
	"forbidden":         ErrForbidden,
	"too_many_requests": ErrTooManyRequests,
	"unavailable":       ErrUnavailable,
}

// The shared table of answers (clients/cases/errors.json): every client classifies each
// the same way.
func TestEachAnswerIsClassifiedAsTheSharedTableSays(t *testing.T) {
	raw, err := os.ReadFile("../cases/errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Cases []struct {
			Status           int             `json:"status"`
			Body             json.RawMessage `json:"body"`
			RetryAfterHeader string          `json:"retry_after_header"`
			Class            string          `json:"class"`
			RetryAfterMs     *int64          `json:"retry_after_ms"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	for _, c := range table.Cases {
		t.Run(fmt.Sprintf("%d-%s", c.Status, c.Class), func(t *testing.T) {
			var body errorBody
			_ = json.Unmarshal(c.Body, &body)
			got := errorFrom(c.Status, body, c.RetryAfterHeader)
			if got.Kind != errorKinds[c.Class] {
				t.Fatalf("%d %s: kind %v, want %v", c.Status, c.Body, got.Kind, errorKinds[c.Class])
			}
			if c.Class == "forbidden" && !errors.Is(got, ErrUnauthorized) {
				t.Fatal("a 403 is an ErrUnauthorized too")
			}
			if c.RetryAfterMs != nil && got.RetryAfter != time.Duration(*c.RetryAfterMs)*time.Millisecond {
				t.Fatalf("RetryAfter %v, want %d ms", got.RetryAfter, *c.RetryAfterMs)
			}
		})
	}
}

// An answer that is not the contract's (a proxy's page) is ErrUnavailable, never a bare
// JSON error that errors.Is cannot place.
func TestAnAnswerThatIsNotTheContractsIsUnavailable(t *testing.T) {
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		_, _ = w.Write([]byte("<html>a captive portal</html>"))
	}))
	defer replica.Close()
	client, err := New(Options{Servers: []string{replica.URL}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Inspect(context.Background(), "x")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("got %v", err)
	}
}
