package redlockd_test

// Real parts for the client's tests: redis-server masters and the project's redlockd
// binary in front of them, started and stopped by scripts/client-bed (the launcher the
// Python and TypeScript suites use too); a proxy that can lose answers.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func waitFor(t *testing.T, what string, timeout time.Duration, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// projectRoot is the nearest folder above the tests with a Cargo.toml.
func projectRoot(t *testing.T) string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "Cargo.toml")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no Cargo.toml above the tests: they run from the project's checkout")
		}
		dir = up
	}
}

// started is a process the test bed started for this suite (a master or a replica): a
// test may pause, resume or stop it, by the PID the bed gave.
type started struct {
	url string
	pid int
}

func (s *started) signal(sig syscall.Signal) { _ = syscall.Kill(s.pid, sig) }
func (s *started) pause()                    { s.signal(syscall.SIGSTOP) }
func (s *started) resume()                   { s.signal(syscall.SIGCONT) }
func (s *started) stop() {
	s.signal(syscall.SIGCONT)
	s.signal(syscall.SIGKILL)
}

type cluster struct {
	masters  []*started
	replicas []*started
}

// startCluster starts three masters and `replicas` redlockd replicas over them with
// scripts/client-bed (the launcher every client's suite uses); the bed stops them all when
// the test ends and its input is closed.
func startCluster(t *testing.T, replicas int) *cluster {
	bed := exec.Command("python3", filepath.Join(projectRoot(t), "scripts", "client-bed"),
		"--masters", "3", "--replicas", strconv.Itoa(replicas))
	bed.Stderr = os.Stderr
	in, err := bed.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := bed.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := bed.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		_ = bed.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("scripts/client-bed could not start the bed (see its stderr): %v", err)
	}
	type entry struct {
		URL string `json:"url"`
		PID int    `json:"pid"`
	}
	var bedOut struct{ Masters, Replicas []entry }
	if err := json.Unmarshal([]byte(line), &bedOut); err != nil {
		t.Fatalf("scripts/client-bed said %q: %v", line, err)
	}
	c := &cluster{}
	for _, m := range bedOut.Masters {
		c.masters = append(c.masters, &started{url: m.URL, pid: m.PID})
	}
	for _, r := range bedOut.Replicas {
		c.replicas = append(c.replicas, &started{url: r.URL, pid: r.PID})
	}
	return c
}

func (c *cluster) urls() []string {
	out := []string{}
	for _, r := range c.replicas {
		out = append(out, r.url)
	}
	return out
}

func getJSON(url string, out any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// held is the inspect answer for name.
func held(t *testing.T, url, name string) map[string]any {
	t.Helper()
	var body map[string]any
	if err := getJSON(url+"/locks/"+name, &body); err != nil {
		t.Fatal(err)
	}
	return body
}

// losingProxy forwards each HTTP request to upstream, reads the answer, and closes the
// client's connection without it: an answer lost after the server acted.
type losingProxy struct {
	url      string
	listener net.Listener
	mu       sync.Mutex
	requests []string
}

var contentLength = regexp.MustCompile(`(?i)content-length:\s*(\d+)`)

func startLosingProxy(t *testing.T, upstream string) *losingProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &losingProxy{url: "http://" + l.Addr().String(), listener: l}
	t.Cleanup(func() { l.Close() })
	target := strings.TrimPrefix(upstream, "http://")
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				var head bytes.Buffer
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					head.WriteString(line)
					if line == "\r\n" {
						break
					}
				}
				n := 0
				if m := contentLength.FindStringSubmatch(head.String()); m != nil {
					n, _ = strconv.Atoi(m[1])
				}
				body := make([]byte, n)
				if _, err := io.ReadFull(r, body); err != nil {
					return
				}
				p.mu.Lock()
				p.requests = append(p.requests, head.String())
				p.mu.Unlock()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				_, _ = up.Write(append(head.Bytes(), body...))
				_, _ = up.Read(make([]byte, 65536))
			}()
		}
	}()
	return p
}
