package redlockd

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// The shared table of event streams (clients/cases/sse.json): every client reads each the
// same way.
func TestEachStreamIsReadAsTheSharedTableSays(t *testing.T) {
	raw, err := os.ReadFile("../cases/sse.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Cases []struct {
			About  string            `json:"about"`
			Text   string            `json:"text"`
			Events []json.RawMessage `json:"events"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	for _, c := range table.Cases {
		t.Run(c.About, func(t *testing.T) {
			want := []any{}
			for _, e := range c.Events {
				var pair []any
				if err := json.Unmarshal(e, &pair); err != nil {
					t.Fatal(err)
				}
				want = append(want, pair)
			}
			got := []any{}
			// One byte at a time: lines and line ends split across reads.
			err := readEvents(iotest.OneByteReader(strings.NewReader(c.Text)), func(event string, data json.RawMessage) {
				var value any
				if err := json.Unmarshal(data, &value); err != nil {
					t.Fatalf("%s: data %q is not JSON", event, data)
				}
				got = append(got, []any{event, value})
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("read %v, want %v", got, want)
			}
		})
	}
}
