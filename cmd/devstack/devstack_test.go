package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The stack under test is the devstack binary, run as `make dev` runs it (a separate process,
// signalled and killed like one), on a temp state dir and free ports.

// devstackBinary is bin/devstack, built before the tests by `make tools-test` (make test does),
// as `make dev` builds it.
func devstackBinary(t *testing.T) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "bin", "devstack"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("bin/devstack is missing: run `make tools-test` (make test does) before this test: %v", err)
	}
	return path
}

func assets(t *testing.T) string {
	t.Helper()
	a := os.Getenv("KUBEBUILDER_ASSETS")
	if a == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run hack/build-control-plane.sh (make test does)")
	}
	return a
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stack is one devstack process.
type stack struct {
	cmd        *exec.Cmd
	stateDir   string
	brokerAddr string
	mu         sync.Mutex
	out        strings.Builder
	exited     chan struct{}
	exitErr    error
}

func (s *stack) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// startStack runs devstack on stateDir and waits until it says it is up.
func startStack(t *testing.T, stateDir string) *stack {
	t.Helper()
	s := &stack{stateDir: stateDir, brokerAddr: freeAddr(t), exited: make(chan struct{})}
	s.cmd = exec.Command(devstackBinary(t), "--assets", assets(t), "--state-dir", stateDir,
		"--crd-dir", "../../config/crd/bases", "--rbac-dir", "../../config/rbac", "--samples", "../../config/samples",
		"--broker-addr", s.brokerAddr, "--metrics-bind-address", freeAddr(t), "--health-probe-bind-address", freeAddr(t),
		"--service-metrics-bind-address", freeAddr(t), "--service-health-probe-bind-address", freeAddr(t))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	up := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			s.mu.Lock()
			s.out.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if strings.Contains(sc.Text(), "a2a-fleet local stack is up") {
				once.Do(func() { close(up) })
			}
		}
	}()
	go func() {
		s.exitErr = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(20 * time.Second):
				_ = s.cmd.Process.Kill()
			}
		}
		// Whatever happened, leave no control plane behind for the next test.
		_ = stopStaleControlPlane(filepath.Join(stateDir, "etcd"), stateDir)
		if t.Failed() {
			t.Logf("devstack output:\n%s", s.output())
		}
	})
	select {
	case <-up:
	case <-s.exited:
		t.Fatalf("devstack exited before it was up: %v\n%s", s.exitErr, s.output())
	case <-time.After(4 * time.Minute):
		t.Fatalf("devstack not up after 4 minutes:\n%s", s.output())
	}
	return s
}

// TestMain gives controller-runtime's client a logger: without one it prints a stack trace
// ("log.SetLogger(...) was never called") into the test output the first time it logs.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

func (s *stack) kube(t *testing.T) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(s.stateDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// connect connects as the sample Agent name with its Secret.
func (s *stack) connect(t *testing.T, ctx context.Context, name string) *a2amqtt.Conn {
	t.Helper()
	c := s.kube(t)
	agent := &a2av1.Agent{}
	var secret corev1.Secret
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, agent)
		if err == nil && agent.Status.CredentialsSecret != "" {
			if err = c.Get(ctx, client.ObjectKey{Namespace: "default", Name: agent.Status.CredentialsSecret}, &secret); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no credentials for %s: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ref, err := a2amqtt.ParseAgentRef(string(secret.Data["clientID"]))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: "mqtt://" + s.brokerAddr, Agent: ref,
		Username: string(secret.Data["username"]), Password: string(secret.Data["password"]), ConnectTimeout: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	return conn
}

// TestMemoryRemembersAcrossAKill9: the governed memory sample reads earlier turns from the
// conversation service (bbolt in the state dir), so a conversation goes on after kill -9 of the
// whole stack; the next devstack stops the etcd and kube-apiserver the killed one left running,
// and says so. (With the agent's own task store, turn 2 after the kill answered "This is the start
// of our conversation"; and the next devstack failed "timeout waiting for process etcd to start".)
func TestMemoryRemembersAcrossAKill9(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	stateDir := t.TempDir()
	first := startStack(t, stateDir)
	conn := first.connect(t, ctx, "console")
	req, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	memory := a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "memory-agent"}
	conv := a2amqtt.NewConversation(req.Transport(memory))
	res, err := conv.Send(ctx, "I like tea")
	if err != nil || !strings.Contains(a2amqtt.ResultText(res), "Turn 1.") {
		t.Fatalf("turn 1: %v %q", err, a2amqtt.ResultText(res))
	}
	state := conv.State()
	_ = conn.Close(ctx)
	cp := controlPlaneProcesses(filepath.Join(stateDir, "etcd"), stateDir)
	if len(cp) < 2 {
		t.Fatalf("control plane processes of the running stack: %+v", cp)
	}

	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.exited
	// kube-controller-manager dies with devstack (Pdeathsig); etcd and kube-apiserver, which
	// envtest starts, stay behind.
	var orphans []staleProcess
	for _, p := range cp {
		if p.name == "kube-controller-manager" {
			deadline := time.Now().Add(5 * time.Second)
			for alive(p.pid) && !zombie(p.pid) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if alive(p.pid) && !zombie(p.pid) {
				t.Errorf("kube-controller-manager (pid %d) outlived the killed devstack", p.pid)
			}
			continue
		}
		if !alive(p.pid) {
			t.Fatalf("%s (pid %d) went with the killed devstack: the test shows nothing", p.name, p.pid)
		}
		orphans = append(orphans, p)
	}

	second := startStack(t, stateDir)
	for _, p := range orphans {
		want := fmt.Sprintf("a %s (pid %d) of an earlier devstack", p.name, p.pid)
		if !strings.Contains(second.output(), want) {
			t.Errorf("the second devstack did not report %q:\n%s", want, second.output())
		}
	}
	conn = second.connect(t, ctx, "console")
	defer conn.Close(context.Background())
	req, err = a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if conv, err = a2amqtt.ResumeConversation(req.Transport(memory), state); err != nil {
		t.Fatal(err)
	}
	res, err = conv.Send(ctx, "and coffee")
	if err != nil || !strings.Contains(a2amqtt.ResultText(res), "Turn 2.") || !strings.Contains(a2amqtt.ResultText(res), `"I like tea"`) {
		t.Fatalf("turn 2 after kill -9 of the stack: %v %q", err, a2amqtt.ResultText(res))
	}
	if s, ok := res.(*a2a.Task); ok && s.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("turn 2: %s", s.Status.State)
	}
	t.Logf("turn 2 after kill -9: %q", a2amqtt.ResultText(res))
}

// TestSIGTERMWithConnectedClientsStopsEverything: SIGTERM stops the stack within 10 s while 20
// clients that reconnect at once and 3 connections that never send a CONNECT are connected to its
// broker, and leaves no etcd, kube-apiserver or listener behind. (It waited in mochi's close for
// as long as the clients stayed, 35 s and more; a second Ctrl-C then orphaned etcd and
// kube-apiserver.)
func TestSIGTERMWithConnectedClientsStopsEverything(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	stateDir := t.TempDir()
	s := startStack(t, stateDir)
	c := s.kube(t)
	const n = 20
	for i := range n {
		a := &a2av1.Agent{}
		a.Name, a.Namespace = fmt.Sprintf("load-%d", i), "default"
		a.Spec.OrgID, a.Spec.UnitID = "acme", "load"
		a.Spec.Card.Name, a.Spec.Card.Description = a.Name, "a client of the shutdown test"
		if err := c.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	var conns []*a2amqtt.Conn
	for i := range n {
		conns = append(conns, s.connect(t, ctx, fmt.Sprintf("load-%d", i)))
	}
	for range 3 {
		raw, err := net.Dial("tcp", s.brokerAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
	}
	cp := controlPlaneProcesses(filepath.Join(stateDir, "etcd"), stateDir)
	if len(cp) < 2 {
		t.Fatalf("control plane processes of the running stack: %+v", cp)
	}

	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("devstack still running 10 s after SIGTERM with %d clients connected", n)
	}
	took := time.Since(start)
	for _, p := range cp {
		if alive(p.pid) && !zombie(p.pid) {
			t.Errorf("%s (pid %d) still running after devstack exited", p.name, p.pid)
		}
	}
	if left := controlPlaneProcesses(filepath.Join(stateDir, "etcd"), stateDir); len(left) > 0 {
		t.Errorf("control plane processes left: %+v", left)
	}
	if raw, err := net.DialTimeout("tcp", s.brokerAddr, time.Second); err == nil {
		_ = raw.Close()
		t.Error("something still listens on the broker's address")
	}
	for _, conn := range conns {
		_ = conn.Close(context.Background())
	}
	t.Logf("devstack exited %s after SIGTERM (%v) with %d clients connected", took.Round(10*time.Millisecond), s.exitErr, n)
	if s.exitErr != nil {
		t.Errorf("devstack's exit: %v (a stop that finished should exit 0)", s.exitErr)
	}
}

// TestRotationReachesTheExampleAgents: the example agents of make dev read their credentials
// folder (kept from the Secrets by the stack) at every CONNECT, so after a rotation of echo's and
// memory's credentials both answer again within seconds. (They were given the password once: the
// broker refused them for good, issue 23's "68 s and more" of -32004.)
func TestRotationReachesTheExampleAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := startStack(t, t.TempDir())
	conn := s.connect(t, ctx, "console")
	defer conn.Close(context.Background())
	req, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 2 * time.Second, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	c := s.kube(t)
	for _, target := range []struct{ name, agent string }{{"echo", "echo"}, {"memory", "memory-agent"}} {
		tr := req.Transport(a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: target.agent})
		ask := func() error {
			_, err := a2amqtt.NewConversation(tr).Send(ctx, "ping")
			return err
		}
		if err := ask(); err != nil {
			t.Fatalf("%s before the rotation: %v", target.name, err)
		}
		agent := &a2av1.Agent{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: target.name}, agent); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(agent.DeepCopy())
		if agent.Annotations == nil {
			agent.Annotations = map[string]string{}
		}
		agent.Annotations["a2a.fleet.dev/rotate-credentials"] = time.Now().String()
		if err := c.Patch(ctx, agent, patch); err != nil {
			t.Fatal(err)
		}
		rotated := time.Now()
		// The rotation kicks the agent when the broker gets the new password; wait for that.
		secret := &corev1.Secret{}
		for {
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: target.name + "-mqtt-credentials"}, secret); err == nil &&
				secret.Annotations["a2a.fleet.dev/rotated-for"] == agent.Annotations["a2a.fleet.dev/rotate-credentials"] {
				break
			}
			if time.Since(rotated) > time.Minute {
				t.Fatalf("%s: the Secret did not get the rotation", target.name)
			}
			time.Sleep(50 * time.Millisecond)
		}
		failed := 0
		for ask() != nil {
			failed++
			if time.Since(rotated) > 15*time.Second {
				t.Fatalf("%s does not answer %s after its credentials were rotated", target.name, time.Since(rotated).Round(time.Second))
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("%s answers again %s after the rotation (%d requests failed in between)", target.name, time.Since(rotated).Round(10*time.Millisecond), failed)
	}
}

// TestExampleAgentCardsVerify: the dev stack signs cards as the installs do (a generated key
// Secret), the example agents leave their cards to the operator, and a client that follows the
// retained key set verifies every example agent's card: through the SDK, and through bin/a2actl
// (`a2actl agents` as the console Agent, whose SIGNATURE is verified), and the example agents'
// cards say online. Before, the stack's operator signed nothing: no key set was retained and the
// cards were unsigned.
func TestExampleAgentCardsVerify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := startStack(t, t.TempDir())
	c := s.kube(t)
	var examples a2av1.AgentList
	if err := c.List(ctx, &examples, client.InNamespace("default"), client.HasLabels{exampleLabel}); err != nil {
		t.Fatal(err)
	}
	if len(examples.Items) == 0 {
		t.Fatal("the samples name no example agents")
	}
	want := map[string]bool{}
	for i := range examples.Items {
		want[identity.Of(&examples.Items[i]).String()] = true
	}

	conn := s.connect(t, ctx, "console")
	trust, err := a2amqtt.FollowCardKeys(ctx, conn, 30*time.Second)
	if err != nil {
		t.Fatalf("the stack retains no card keys: %v", err)
	}
	if n := len(trust.Keys().Keys); n != 1 {
		t.Fatalf("retained key set: %d keys, want the one generated key", n)
	}
	conn.TrustCards(trust)
	dir, err := a2amqtt.NewDirectory(ctx, conn, a2amqtt.DirectoryFilter("acme"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		states := map[string]string{}
		for _, e := range dir.Agents() {
			if want[e.Agent.String()] {
				states[e.Agent.String()] = e.Signature.State
				if e.Signature.Err != nil {
					states[e.Agent.String()] += ": " + e.Signature.Err.Error()
				}
			}
		}
		verified := 0
		for _, st := range states {
			if st == a2amqtt.CardVerified {
				verified++
			}
		}
		if verified == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("example agents' cards against the retained key set: %v (want all %d verified)", states, len(want))
		}
		time.Sleep(200 * time.Millisecond)
	}

	// a2actl as the dev stack's banner suggests, as the console Agent (this test's connection,
	// with the same client ID, closed first): it follows the retained key set by itself.
	_ = trust.Close(ctx)
	_ = conn.Close(ctx)
	a2actl, err := filepath.Abs(filepath.Join("..", "..", "bin", "a2actl"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, a2actl, "--broker", "mqtt://"+s.brokerAddr, "--as-agent", "console", "-n", "default",
		"agents", "--org", "acme", "--wait=2s", "--json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(s.stateDir, "kubeconfig"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("a2actl agents: %v\n%s%s", err, out, stderr.String())
	}
	var rows []struct {
		Agent     string `json:"agent"`
		Status    string `json:"status"`
		Signature string `json:"signature"`
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("a2actl agents --json: %v\n%s", err, out)
	}
	seen := 0
	for _, r := range rows {
		if !want[r.Agent] {
			continue
		}
		seen++
		if r.Signature != a2amqtt.CardVerified {
			t.Errorf("a2actl agents: %s SIGNATURE %q, want %q", r.Agent, r.Signature, a2amqtt.CardVerified)
		}
		// The operator publishes the cards with the broker's view of the connection; the stack
		// says it is up once they say online (a2actl chat would warn about an offline agent).
		if r.Status != a2amqtt.StatusOnline {
			t.Errorf("a2actl agents: %s STATUS %q, want %q", r.Agent, r.Status, a2amqtt.StatusOnline)
		}
	}
	if seen != len(want) {
		t.Errorf("a2actl agents listed %d of the %d example agents:\n%s", seen, len(want), out)
	}
}
