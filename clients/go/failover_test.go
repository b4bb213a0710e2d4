package redlockd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
)

// failoverTable is clients/cases/failover.json: how every client goes round the replicas.
type failoverTable struct {
	OKBody json.RawMessage `json:"ok_body"`
	Cases  []struct {
		Name     string              `json:"name"`
		Replicas [][]json.RawMessage `json:"replicas"`
		Calls    []struct {
			Tried  []int  `json:"tried"`
			Result string `json:"result"`
			Code   string `json:"code"`
		} `json:"calls"`
	} `json:"cases"`
}

// replicas answers as a case's replicas do, in place of the network, and records which
// it was asked.
type replicas struct {
	mu      sync.Mutex
	answers [][]json.RawMessage
	okBody  json.RawMessage
	tried   []int
}

func (r *replicas) RoundTrip(req *http.Request) (*http.Response, error) {
	var i int
	if _, err := fmt.Sscanf(req.URL.Hostname(), "replica-%d", &i); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.tried = append(r.tried, i)
	answer := r.answers[i][0]
	if len(r.answers[i]) > 1 {
		r.answers[i] = r.answers[i][1:]
	}
	r.mu.Unlock()
	var word string
	if json.Unmarshal(answer, &word) == nil {
		if word == "refused" {
			return nil, errors.New("connection refused")
		}
		return respond(200, r.okBody), nil
	}
	var given struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(answer, &given); err != nil {
		return nil, err
	}
	return respond(given.Status, given.Body), nil
}

func respond(status int, body []byte) *http.Response {
	return &http.Response{
		StatusCode: status,
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(bytes.NewReader(body)),
	}
}

// The shared table of failover (clients/cases/failover.json): every client goes round the
// replicas the same way.
func TestTheClientGoesRoundTheReplicasAsTheSharedTableSays(t *testing.T) {
	raw, err := os.ReadFile("../cases/failover.json")
	if err != nil {
		t.Fatal(err)
	}
	var table failoverTable
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	for _, c := range table.Cases {
		t.Run(strings.ReplaceAll(c.Name, " ", "_"), func(t *testing.T) {
			net := &replicas{answers: c.Replicas, okBody: table.OKBody}
			servers := make([]string, len(c.Replicas))
			for i := range servers {
				servers[i] = fmt.Sprintf("http://replica-%d", i)
			}
			client, err := New(Options{Servers: servers, HTTPClient: &http.Client{Transport: net}})
			if err != nil {
				t.Fatal(err)
			}
			for n, call := range c.Calls {
				net.tried = nil
				status, err := client.Inspect(context.Background(), "job")
				if call.Result == "ok" {
					if err != nil || !status.Held || status.FencingToken != 7 {
						t.Fatalf("call %d: %+v, %v", n, status, err)
					}
				} else {
					var e *Error
					if !errors.As(err, &e) || e.Kind != errorKinds[call.Result] || e.Code != call.Code {
						t.Fatalf("call %d: %v, want %s with code %s", n, err, call.Result, call.Code)
					}
				}
				if fmt.Sprint(net.tried) != fmt.Sprint(call.Tried) {
					t.Fatalf("call %d tried %v, want %v", n, net.tried, call.Tried)
				}
			}
		})
	}
}
