// Package redistest runs real redis-server and redis-sentinel processes (Debian's packages,
// installed by hack/install-redis.sh) for tests: one server, or a primary with replicas watched
// by a Sentinel set, on loopback; or, so that a test can cut the primary off the network rather
// than kill it, with the primary in a network namespace of its own (Netns).
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ServerBin is redis-server: $REDIS_SERVER_BIN, else the Debian package's path.
func ServerBin(t testing.TB) string {
	return binary(t, "REDIS_SERVER_BIN", "/usr/bin/redis-server")
}

// SentinelBin is redis-sentinel: $REDIS_SENTINEL_BIN, else the Debian package's path.
func SentinelBin(t testing.TB) string {
	return binary(t, "REDIS_SENTINEL_BIN", "/usr/bin/redis-sentinel")
}

func binary(t testing.TB, env, def string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		bin = def
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s not found: run hack/install-redis.sh (make redis), or set %s: %v", bin, env, err)
	}
	return bin
}

// Options configures Start. The zero value is a redis-server that keeps nothing on disk, on a
// free port of 127.0.0.1.
type Options struct {
	// Host is the address the server binds and is reached at (default 127.0.0.1; with Netns,
	// the namespace's address).
	Host string
	// Netns runs the server inside that network namespace, bound to its address.
	Netns *Netns
	// Args are extra redis-server arguments ("--replicaof", "h", "p", ...).
	Args []string
}

// Server is a redis-server (or redis-sentinel) child process. Kill and Restart keep its port,
// directory and arguments: a restarted server is the same node.
type Server struct {
	t    testing.TB
	Host string
	Port int
	bin  string
	args []string
	ns   *Netns

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *bytes.Buffer
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Start runs a redis-server for the test (killed at its end) and returns once it answers PING.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	host := o.Host
	if o.Netns != nil {
		host = o.Netns.InsideIP
	}
	if host == "" {
		host = "127.0.0.1"
	}
	dir := t.TempDir()
	return startNode(t, ServerBin(t), host, o.Netns, func(port int) []string {
		return append([]string{"--port", strconv.Itoa(port), "--bind", host, "--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no", "--protected-mode", "no",
			// A replica's first sync starts at once instead of after 5 s.
			"--repl-diskless-sync-delay", "0"}, o.Args...)
	})
}

// startNode starts bin with the arguments args(port) on a free port of host, retrying with
// another port when the one picked was taken meanwhile.
func startNode(t testing.TB, bin, host string, ns *Netns, args func(port int) []string) *Server {
	t.Helper()
	var lastErr error
	for range 5 {
		port := freePort(t, host, ns)
		s := &Server{t: t, Host: host, Port: port, bin: bin, args: args(port), ns: ns}
		if err := s.start(); err != nil {
			lastErr = err
			continue
		}
		t.Cleanup(func() {
			s.Kill()
			if t.Failed() {
				t.Logf("%s %s output (last 4 KiB):\n%s", bin, s.Addr(), tail(s.Output(), 4096))
			}
		})
		return s
	}
	t.Fatalf("%s did not come up: %v", bin, lastErr)
	return nil
}

// freePort is a port nothing listens on at host (in the namespace, any: it is the server's own).
func freePort(t testing.TB, host string, ns *Netns) int {
	if ns != nil {
		host = "127.0.0.1" // the namespace's ports are its own; any free one will do
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("find a free port on %s: %v", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start() error {
	name, args := s.bin, s.args
	if s.ns != nil {
		name, args = "ip", append([]string{"netns", "exec", s.ns.Name, s.bin}, s.args...)
	}
	out := &bytes.Buffer{}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited, s.out = cmd, exited, out
	s.mu.Unlock()
	if err := s.waitUp(exited); err != nil {
		s.Kill()
		return fmt.Errorf("%w; output:\n%s", err, out.String())
	}
	return nil
}

func (s *Server) waitUp(exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PONG from %s within 15 s", s.Addr())
}

// Kill is kill -9: no shutdown, nothing saved. It returns once the process is gone.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Running reports whether the process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Restart starts the node again after Kill, with its port, directory and arguments.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 10 { // the port may linger a moment after the kill
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.t.Fatalf("restart %s at %s: %v", s.bin, s.Addr(), err)
}

// Output is what the process wrote so far.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// Client is a go-redis client of this node (closed at the end of the test).
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Role is the node's replication role as ROLE says it ("master", "slave") and, for a replica,
// its primary's address and whether the link to it is up.
func (s *Server) Role(ctx context.Context) (role, primary string, linkUp bool, err error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", "", false, err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	role = fields["role"]
	if role == "slave" {
		primary = net.JoinHostPort(fields["master_host"], fields["master_port"])
		linkUp = fields["master_link_status"] == "up"
	}
	return role, primary, linkUp, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
