package redlockd_test

// Real parts for the client's tests: redis-server masters on free loopback ports, each in
// its own directory, and the project's redlockd binary in front of them; a proxy that can
// lose answers. Everything started here is stopped here, by PID.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
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

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
			t.Fatal("no Cargo.toml above the tests: set REDLOCKD_BIN")
		}
		dir = up
	}
}

func binary(t *testing.T) string {
	if b := os.Getenv("REDLOCKD_BIN"); b != "" {
		return b
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = filepath.Join(projectRoot(t), "target")
	}
	return filepath.Join(target, "debug", "redlockd")
}

type master struct {
	port int
	cmd  *exec.Cmd
}

func startMaster(t *testing.T) *master {
	for i := 0; i < 5; i++ {
		m := &master{port: freePort(t)}
		m.cmd = exec.Command("redis-server", "--port", strconv.Itoa(m.port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--logfile", "redis.log")
		if err := m.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = m.cmd.Wait(); close(exited) }()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-exited:
				deadline = time.Time{}
				continue
			default:
			}
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", m.port), 500*time.Millisecond); err == nil {
				_, _ = c.Write([]byte("PING\r\n"))
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Close()
				if strings.HasPrefix(line, "+PONG") {
					t.Cleanup(m.stop)
					return m
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		m.stop()
	}
	t.Fatal("could not start redis-server on a free port")
	return nil
}

func (m *master) url() string { return fmt.Sprintf("redis://127.0.0.1:%d", m.port) }
func (m *master) pause()      { _ = m.cmd.Process.Signal(syscall.SIGSTOP) }
func (m *master) resume()     { _ = m.cmd.Process.Signal(syscall.SIGCONT) }
func (m *master) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGCONT)
	_ = m.cmd.Process.Kill()
}

type replica struct {
	url string
	cmd *exec.Cmd
}

func startReplica(t *testing.T, masters []*master) *replica {
	port := freePort(t)
	urls := make([]string, len(masters))
	for i, m := range masters {
		urls[i] = m.url()
	}
	r := &replica{url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	r.cmd = exec.Command(binary(t))
	r.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		fmt.Sprintf("REDLOCKD_LISTEN=127.0.0.1:%d", port),
		"REDLOCKD_REDIS_URLS=" + strings.Join(urls, ","),
		"RUST_LOG=warn",
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait() }()
	t.Cleanup(r.stop)
	waitFor(t, "redlockd to be ready", 10*time.Second, func() bool {
		var body struct{ Ready bool }
		return getJSON(r.url+"/readyz", &body) == nil && body.Ready
	})
	return r
}

func (r *replica) stop() { _ = r.cmd.Process.Kill() }

type cluster struct {
	masters  []*master
	replicas []*replica
}

func startCluster(t *testing.T, replicas int) *cluster {
	c := &cluster{}
	for i := 0; i < 3; i++ {
		c.masters = append(c.masters, startMaster(t))
	}
	for i := 0; i < replicas; i++ {
		c.replicas = append(c.replicas, startReplica(t, c.masters))
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
