package redlockd_test

// The README's install steps and five lines, followed as a newcomer would: a module of its
// own in a temporary folder outside the checkout, the shell steps run as written (the
// checkout's path put in), and the five lines inside a function of the user's, run against
// the test's servers.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const readmeServers = `"http://redlockd-0:8080", "http://redlockd-1:8080"`

func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// The user's program around the five lines: its imports, its sendReport (which checks the
// lock is held with the token it is given), and a function that returns an error.
const userProgram = `package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	redlockd "github.com/redlockd/redlockd/clients/go"
)

func sendReport(ctx context.Context, fence uint64) error {
	resp, err := http.Get(os.Getenv("CHECK_URL"))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var held struct {
		Held  bool   ` + "`json:\"held\"`" + `
		Token uint64 ` + "`json:\"fencing_token\"`" + `
	}
	if err := json.NewDecoder(resp.Body).Decode(&held); err != nil {
		return err
	}
	if !held.Held || held.Token != fence || ctx.Err() != nil {
		return fmt.Errorf("not held with %d: %+v", fence, held)
	}
	fmt.Println("report sent with fence", fence)
	return nil
}

func run(ctx context.Context) error {
FIVE_LINES}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`

func TestTheReadmeInstallsAndRunsAsWritten(t *testing.T) {
	install, five := readmeBlocks(t, "sh"), readmeBlocks(t, "go")
	if len(install) != 1 || len(five) != 1 || !strings.Contains(five[0], readmeServers) {
		t.Fatalf("the README has one install block and one Go block naming its servers")
	}
	c := startCluster(t, 2)
	checkout := projectRoot(t)
	app := t.TempDir()
	if strings.HasPrefix(app, checkout) {
		t.Fatal("the user's module must live outside the checkout")
	}
	env := append(os.Environ(), "GOPROXY=off", "GOFLAGS=",
		"CHECK_URL="+c.urls()[0]+"/locks/nightly-report")
	sh := func(line string) {
		cmd := exec.Command("bash", "-c", line)
		cmd.Dir, cmd.Env = app, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
	}
	sh("go mod init example.com/nightly")
	servers := `"` + strings.Join(c.urls(), `", "`) + `"`
	program := strings.Replace(userProgram, "FIVE_LINES", strings.Replace(five[0], readmeServers, servers, 1), 1)
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(install[0], "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			sh(strings.ReplaceAll(line, "/path/to/redlockd", checkout))
		}
	}
	cmd := exec.Command("go", "run", ".")
	cmd.Dir, cmd.Env = app, env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "report sent with fence") {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	if h := held(t, c.urls()[0], "nightly-report"); h["held"] != false {
		t.Fatal("the deferred release did not free the lock")
	}
}
