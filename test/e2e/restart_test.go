package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// serviceBinary is cmd/conversation-service, built before the tests by `make tools-test`
// (make test does).
func serviceBinary(t testing.TB) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "bin", "conversation-service"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("bin/conversation-service is missing: run `make tools-test` (make test does) before this test: %v", err)
	}
	return path
}

// kubeconfig writes restCfg as a kubeconfig file for subprocesses.
func kubeconfig(t testing.TB) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: restCfg.Host, CertificateAuthorityData: restCfg.CAData, InsecureSkipTLSVerify: restCfg.Insecure}
	cfg.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{ClientCertificateData: restCfg.CertData, ClientKeyData: restCfg.KeyData, Token: restCfg.BearerToken}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// proc is a conversation-service subprocess.
type proc struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	exited chan struct{}
	state  string // "running at the end of the test" when it was
}

func (st *stack) spawnService(t testing.TB, replica, store string, extra ...string) *proc {
	t.Helper()
	health := freePort(t)
	args := append([]string{"--broker", st.brokerURL, "--username", st.svcUser, "--replica-id", replica, "--store", store,
		"--namespace", st.ns, "--kubeconfig", kubeconfig(t), "--metrics-bind-address", "0",
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", health), "--sweep-interval", "100ms",
		// One requester drives back-to-back turns, faster than any caller's rate limit allows.
		"--caller-rate=-1"}, extra...)
	p := &proc{cmd: exec.Command(serviceBinary(t), args...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "A2A_PASSWORD="+st.svcPass)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start service: %v", err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			p.state = "exited during the test: " + p.cmd.ProcessState.String()
		default:
			p.state = "running at the end of the test"
			if t.Failed() && os.Getenv("E2E_DUMP_STACKS") == "1" {
				_ = p.cmd.Process.Signal(syscall.SIGQUIT)
				<-p.exited
			}
		}
		p.kill()
		if t.Failed() {
			t.Logf("service %s (%v) output:\n%s", replica, p.state, p.out.String())
		}
	})
	eventually(t, 60*time.Second, "service "+replica+" ready", func() error {
		select {
		case <-p.exited:
			t.Fatalf("service exited: %s", p.out.String())
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	return p
}

// kill is kill -9: no graceful shutdown, no final writes.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func TestRestartKeepsConversations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "mosquitto")
	memoryConn := startSDKAgent(t, ctx, st, agents.KindMemory, "memory", 0)
	store := "bolt:" + filepath.Join(t.TempDir(), "state.db")
	svc := st.spawnService(t, "r1", store)
	r := st.requester(t, ctx)
	conv := a2amqtt.NewConversation(r.Transport(ref("memory")))
	if _, err := conv.Send(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	if res, err := conv.Send(ctx, "remind me to water the plants"); err != nil || state(res) != a2a.TaskStateInputRequired {
		t.Fatalf("interrupt: %v %v", err, state(res))
	}
	svc.kill()
	st.spawnService(t, "r1", store)
	res, err := conv.Send(ctx, "tonight")
	if err != nil || state(res) != a2a.TaskStateCompleted || !containsAll(a2amqtt.ResultText(res), "water the plants tonight") {
		t.Fatalf("resume after kill -9: %v %v %q", err, state(res), a2amqtt.ResultText(res))
	}
	if _, err := conv.Send(ctx, "third"); err != nil {
		t.Fatalf("next turn after restart: %v", err)
	}
	agentSide, err := a2amqtt.NewRequester(ctx, memoryConn, a2amqtt.RequesterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := agentSide.Transport(identity.Service).ListTasks(ctx, nil, &a2a.ListTasksRequest{ContextID: conv.ContextID()})
	if err != nil || len(list.Tasks) != 3 {
		t.Fatalf("history after restart: %v %+v", err, list)
	}
	for _, tk := range list.Tasks {
		if tk.Status.State != a2a.TaskStateCompleted {
			t.Errorf("task %s in state %s after restart, want completed", tk.ID, tk.Status.State)
		}
	}
}

func TestTwoReplicasOnRedis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := startRedis(t)
	st := newStack(t, ctx, "mosquitto")
	startRawAgent(t, ctx, st.addr, st.usernames["guarded"], st.passwords["guarded"], ref("guarded"), identity.DeliveryTopic(ref("guarded")))
	store := "redis://" + addr + "/0"
	a := st.spawnService(t, "a", store, "--lease-ttl=3s")
	st.spawnService(t, "b", store, "--lease-ttl=3s")
	r := st.requester(t, ctx)
	guarded := r.Transport(ref("guarded"))
	c := uuid.NewString()
	// The replicas split the gated agents (leases in Redis); the owner of
	// "guarded" decides from memory. With maxConcurrentTasksPerContext 1, a
	// follow-up sent right after a completion must be accepted every time.
	turns := func(n int) {
		t.Helper()
		for i := range n {
			res, err := send(ctx, guarded, uuid.NewString(), c, "go")
			if err != nil || state(res) != a2a.TaskStateCompleted {
				t.Fatalf("turn %d: %v %v", i, err, state(res))
			}
		}
	}
	turns(200)
	// kill -9 one replica (whichever owns the agent, the other takes over
	// what it does not yet own once the dead one's leases lapse): the
	// conversation goes on, with its state, on the survivor.
	a.kill()
	killed := time.Now()
	quick, err := a2amqtt.NewRequester(ctx, r.Conn(), a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: time.Second, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the surviving replica serves the agent", func() error {
		res, err := send(ctx, quick.Transport(ref("guarded")), uuid.NewString(), c, "go")
		if err != nil || state(res) != a2a.TaskStateCompleted {
			return fmt.Errorf("%v %v", err, state(res))
		}
		return nil
	})
	t.Logf("agent served again %s after kill -9 of replica a (lease TTL 3s)", time.Since(killed).Round(10*time.Millisecond))
	turns(200)
}

// startRedis runs a throwaway redis-server (hack/install-redis.sh) on a free
// loopback port.
func startRedis(t testing.TB) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startRedisAt(t, addr)
	return addr
}

// startRedisAt runs a redis-server that keeps nothing on disk at addr (a
// loopback host:port) and returns once it answers; the test's cleanup kills
// it, and so may the test (an outage).
func startRedisAt(t testing.TB, addr string) *exec.Cmd {
	t.Helper()
	bin := os.Getenv("REDIS_SERVER_BIN")
	if bin == "" {
		bin = "/usr/bin/redis-server"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("redis-server not found at %s: run hack/install-redis.sh (or set REDIS_SERVER_BIN): %v", bin, err)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	eventually(t, 10*time.Second, "redis up", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return c.Ping(ctx).Err()
	})
	return cmd
}
