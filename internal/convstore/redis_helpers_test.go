package convstore

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServerBin finds redis-server: $REDIS_SERVER_BIN, else the Debian
// package's path.
func redisServerBin(t testing.TB) string {
	bin := os.Getenv("REDIS_SERVER_BIN")
	if bin == "" {
		bin = "/usr/bin/redis-server"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("redis-server not found at %s: run hack/install-redis.sh (or set REDIS_SERVER_BIN): %v", bin, err)
	}
	return bin
}

// startRedis runs a throwaway redis-server (no persistence, temp dir) on a
// free loopback port for the test and returns its address.
func startRedis(t testing.TB) string {
	t.Helper()
	bin := redisServerBin(t)
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		var out bytes.Buffer
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := waitRedis(addr, exited); err != nil {
			_ = cmd.Process.Kill()
			lastErr = fmt.Errorf("%w; output:\n%s", err, out.String())
			continue // most likely the port was taken meanwhile
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		return addr
	}
	t.Fatalf("redis-server did not come up: %v", lastErr)
	return ""
}

func waitRedis(addr string, exited <-chan error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "refused") && !strings.Contains(err.Error(), "deadline") && !strings.Contains(err.Error(), "LOADING") {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PONG from %s within 10s", addr)
}
