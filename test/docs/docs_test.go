package docs

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// block is a fenced block of a Markdown file and the docs-test annotation before it.
type block struct {
	file, lang, text, mark string
	line                   int
}

var markRE = regexp.MustCompile(`^<!-- docs-test: (.*) -->$`)

// blocks returns the fenced blocks of a Markdown file with the annotation on the line before each.
func blocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	prev := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			b := block{file: filepath.Base(path), lang: strings.TrimPrefix(line, "```"), line: n}
			if m := markRE.FindStringSubmatch(prev); m != nil {
				b.mark = m[1]
			}
			cur = &b
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
		prev = line
	}
	return out
}

// stack is a running `make dev`.
type stack struct {
	term      *terminal
	brokerURL string
	work      string // the folder the docs' commands run in: bin/dev, bin/k8s, bin/a2actl as in a clone
}

// repoRoot is the repository this package is in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startMakeDev runs `make dev BROKER=broker` on a terminal, as the README says, with its state
// in a fresh folder and every port free (DEV_FLAGS), and waits until the stack says it is up.
// The binaries and the control plane are built before the test (make tools-test): make finds
// them up to date.
func startMakeDev(t *testing.T, broker string) *stack {
	t.Helper()
	root := repoRoot(t)
	for _, bin := range []string{"devstack", "a2actl", "foreground"} {
		if _, err := os.Stat(filepath.Join(root, "bin", bin)); err != nil {
			t.Fatalf("bin/%s is missing: run `make tools-test` (make test does) before this test", bin)
		}
	}
	work := t.TempDir()
	state := filepath.Join(work, "bin", "dev")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"k8s", "a2actl"} {
		if err := os.Symlink(filepath.Join(root, "bin", name), filepath.Join(work, "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	flags := "--metrics-bind-address 0 --health-probe-bind-address 0 --service-metrics-bind-address 0 --service-health-probe-bind-address 0"
	// A make above this test (make test) must not pass its flags and jobserver to this one.
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" && k != "MAKEOVERRIDES" {
			env = append(env, kv)
		}
	}
	if broker == "embedded" {
		flags += " --broker-addr 127.0.0.1:0"
	} else {
		env = append(env, "MOSQUITTO_PORT="+strconv.Itoa(freePort(t)))
	}
	cmd := exec.Command("make", "--no-print-directory", "dev", "BROKER="+broker, "DEV_STATE="+state, "DEV_FLAGS="+flags)
	cmd.Dir, cmd.Env = root, env
	term, err := startTerminal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(term.close)
	if _, err := term.waitFor("local stack is up", 0, 4*time.Minute); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`MQTT broker\s+(mqtt://\S+)`).FindStringSubmatch(term.output())
	if m == nil {
		t.Fatalf("no broker URL in:\n%s", term.output())
	}
	return &stack{term: term, brokerURL: m[1], work: work}
}

// stop types Ctrl-C into make's terminal and requires exit status 0 and no make error line.
func (s *stack) stop(t *testing.T) {
	t.Helper()
	if err := s.term.interrupt(); err != nil {
		t.Fatal(err)
	}
	code, err := s.term.wait(2 * time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out := s.term.output()
	if code != 0 || strings.Contains(out, "make: ***") {
		t.Fatalf("make dev after Ctrl-C: exit status %d (-1: killed by a signal), want 0; last output:\n%s", code, tail(out, 30))
	}
	t.Logf("make dev stopped by Ctrl-C with exit status 0 (%s)", strings.TrimSpace(lastLine(out)))
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// The docs name the stack's default broker address; the test's stack listens on a free port.
const docsBroker = "mqtt://127.0.0.1:1883"

// script is what bash runs for a block: the file's earlier run blocks (their exports and
// aliases, output discarded), then the block.
func (s *stack) script(setup []string, text string) string {
	var b strings.Builder
	b.WriteString("set -euo pipefail\nshopt -s expand_aliases\n")
	for _, p := range setup {
		b.WriteString("{\n" + p + "} >/dev/null 2>&1\n")
	}
	b.WriteString(text)
	return strings.ReplaceAll(b.String(), docsBroker, s.brokerURL)
}

func (s *stack) bash(script string) *exec.Cmd {
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = s.work
	// The docs' commands rely on a2actl's default broker, `make dev`'s address; the test's stack
	// listens on a free port, which a2actl's variable names (a block that exports it is rewritten
	// by script the same way).
	cmd.Env = append(os.Environ(), "PWD="+s.work, "A2A_BROKER="+s.brokerURL)
	return cmd
}

var (
	uuidRE     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	presenceRE = regexp.MustCompile(`\b(online|offline)\s+(broker|agent|lwt)\b`)
	spacesRE   = regexp.MustCompile(`[ \t]+`)
	ageRE      = regexp.MustCompile(`\s+(AGE|\d+[smhd](\d+[smh])?)$`)
	// connectedRE is the CONNECTED column of `kubectl get agents` (after READY): whether an
	// agent's process is online yet depends on how long after the start the command ran.
	connectedRE = regexp.MustCompile(`^(\S+ \S+ \S+ \S+ (?:True|False)) (?:True|False|Unknown)( |$)`)
)

// normalize makes a run's output and the docs' comparable: ids, ages and presence (which item 3
// of issue 26, another change, is about) vary from run to run; column widths follow the longest
// cell.
func normalize(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		l = uuidRE.ReplaceAllString(l, "<id>")
		l = presenceRE.ReplaceAllString(l, "<presence>")
		l = ageRE.ReplaceAllString(strings.TrimRight(l, " "), "")
		l = spacesRE.ReplaceAllString(strings.TrimRight(l, " "), " ")
		out = append(out, connectedRE.ReplaceAllString(l, "$1 <connected>$2"))
	}
	return strings.Join(out, "\n")
}

// chatInputs are the user's lines of a chat transcript: what follows each prompt.
var promptRE = regexp.MustCompile(`^(you(?: \(answer\))?> )(.*)$`)

// runChat runs a block whose last command is an interactive `a2actl chat` on a terminal, types
// the transcript's user lines after each prompt, and returns what the terminal showed.
func (s *stack) runChat(t *testing.T, setup []string, text, transcript string) string {
	t.Helper()
	term, err := startTerminal(s.bash(s.script(setup, text)))
	if err != nil {
		t.Fatal(err)
	}
	defer term.close()
	at := 0
	for _, l := range strings.Split(transcript, "\n") {
		m := promptRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if at, err = term.waitFor(m[1], at, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := term.typeLine(m[2]); err != nil {
			t.Fatal(err)
		}
	}
	if code, err := term.wait(time.Minute); err != nil || code != 0 {
		t.Fatalf("chat exited %d (%v):\n%s", code, err, term.output())
	}
	return term.output()
}

// runDocs runs every annotated shell block of README.md and docs/sdk.md and compares the output
// blocks that follow them. Every sh block must be annotated: run, chat, or "not run: WHY".
func runDocs(t *testing.T, s *stack) {
	root := repoRoot(t)
	for _, file := range []string{"README.md", "docs/sdk.md"} {
		bs := blocks(t, filepath.Join(root, file))
		var setup []string
		for i, b := range bs {
			if b.lang != "sh" {
				continue
			}
			var next *block
			if i+1 < len(bs) && bs[i+1].mark == "output" {
				next = &bs[i+1]
			}
			name := fmt.Sprintf("%s:%d", b.file, b.line)
			switch {
			case strings.HasPrefix(b.mark, "not run: "):
				t.Logf("%s not run: %s", name, strings.TrimPrefix(b.mark, "not run: "))
				continue
			case b.mark == "run":
				t.Run(name, func(t *testing.T) {
					cmd := s.bash(s.script(setup, b.text))
					var stderr strings.Builder
					cmd.Stderr = &stderr
					out, err := cmd.Output()
					if err != nil {
						t.Fatalf("%v\n%s\nstdout:\n%s\nstderr:\n%s", err, b.text, out, stderr.String())
					}
					if next != nil {
						if got, want := normalize(string(out)), normalize(next.text); got != want {
							t.Fatalf("output differs from the docs' (normalised)\n--- got:\n%s\n--- docs:\n%s\n--- raw:\n%s", got, want, out)
						}
					}
				})
				setup = append(setup, b.text)
			case b.mark == "chat":
				if next == nil {
					t.Fatalf("%s: a chat block needs an output block (the transcript) after it", name)
				}
				t.Run(name, func(t *testing.T) {
					if got, want := normalize(s.runChat(t, setup, b.text, next.text)), normalize(next.text); got != want {
						t.Fatalf("chat differs from the docs' transcript (normalised)\n--- got:\n%s\n--- docs:\n%s", got, want)
					}
				})
			default:
				t.Errorf("%s: sh block without a docs-test annotation (<!-- docs-test: run|chat|not run: WHY -->)", name)
			}
		}
	}
}

// TestDocsOnMakeDev: `make dev` on the embedded broker, every shell example of README.md and
// docs/sdk.md typed into it, then Ctrl-C: exit status 0.
func TestDocsOnMakeDev(t *testing.T) {
	s := startMakeDev(t, "embedded")
	runDocs(t, s)
	s.stop(t)
}

// TestDocsOnMakeDevMosquitto: the same on `make dev BROKER=mosquitto`.
func TestDocsOnMakeDevMosquitto(t *testing.T) {
	s := startMakeDev(t, "mosquitto")
	runDocs(t, s)
	s.stop(t)
}
