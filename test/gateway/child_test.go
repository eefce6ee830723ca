package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
)

// A gateway in a child process (the test binary run again), so that its memory is its own:
// BenchmarkGatewaySSEMemory reads its RSS. It is wired as cmd/gateway wires it, from the
// environment the parent sets (childEnv).
const (
	childEnv          = "A2A_GATEWAY_CHILD"
	childKubeHost     = "A2A_GATEWAY_CHILD_KUBE_HOST"
	childKubeDir      = "A2A_GATEWAY_CHILD_KUBE_DIR"
	childBroker       = "A2A_GATEWAY_CHILD_BROKER"
	childNamespace    = "A2A_GATEWAY_CHILD_NAMESPACE"
	childListenPrefix = "LISTEN "
)

// runChildGateway serves until its stdin closes; it prints the URL it listens on.
func runChildGateway() int {
	dir := os.Getenv(childKubeDir)
	cfg := &rest.Config{Host: os.Getenv(childKubeHost), QPS: -1, TLSClientConfig: rest.TLSClientConfig{
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	ns, brokerURL := os.Getenv(childNamespace), os.Getenv(childBroker)
	reader, err := gateway.NewCachedReader(ctx, cfg, ns)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := slog.New(slog.DiscardHandler)
	dir2 := &gateway.Directory{Reader: reader, Namespace: ns}
	pool := gateway.NewPool(gateway.ConnConfig{BrokerURL: brokerURL, Logger: log}, dir2)
	defer pool.Close(context.Background())
	in := gateway.NewInbound(gateway.InboundConfig{Directory: dir2, Pool: pool, BrokerURL: brokerURL, Logger: log,
		Auth: &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: in, ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	fmt.Printf("%shttp://%s\n", childListenPrefix, lis.Addr())
	if err := srv.Serve(lis); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startChildGateway runs a gateway for st in a child process and returns its URL and pid.
func (st *stack) startChildGateway(t testing.TB, ctx context.Context) (string, int) {
	t.Helper()
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ca.crt": restCfg.CAData, "tls.crt": restCfg.CertData, "tls.key": restCfg.KeyData} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childKubeHost+"="+restCfg.Host, childKubeDir+"="+dir,
		childBroker+"="+st.brokerURL, childNamespace+"="+st.ns)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child gateway: %v", err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), childListenPrefix); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return u, cmd.Process.Pid
		}
	}
	t.Fatalf("the child gateway did not start: %v", lines.Err())
	return "", 0
}

// rssMiB reads a process's resident set (VmRSS) or its peak (VmHWM) from /proc.
func procMiB(t testing.TB, pid int, field string) float64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			var kb float64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%f kB", &kb); err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return kb / 1024
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
