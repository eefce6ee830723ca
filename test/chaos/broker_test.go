package chaos

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

func quickstart(t *testing.T) *fleetInput {
	t.Helper()
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.Kustomize(root, "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	return &fleetInput{objs: objs}
}

// openConversation starts a two-turn task on the gated agent and leaves it in input-required.
type openConversation struct{ task, contextID, first string }

func openConversations(ctx context.Context, t *testing.T, f *fleet, n int) []openConversation {
	t.Helper()
	var out []openConversation
	for range n {
		c := openConversation{task: uuid.NewString(), contextID: uuid.NewString(), first: uuid.NewString()[:8]}
		res, err := sendOnce(ctx, f.requester, "gated", c.task, c.contextID, "ask:"+c.first)
		if err != nil || stateOf(res) != a2a.TaskStateInputRequired {
			t.Fatalf("open conversation: %v (state %s)", err, stateOf(res))
		}
		out = append(out, c)
	}
	return out
}

// resume answers every open conversation and expects each task to complete with both turns.
func resume(ctx context.Context, t *testing.T, f *fleet, convs []openConversation) {
	t.Helper()
	for i, c := range convs {
		cctx, cancel := context.WithTimeout(ctx, callDeadline)
		res, err := sendOnce(cctx, f.requester, "gated", c.task, c.contextID, "resumed")
		cancel()
		if want := c.first + "+resumed"; err != nil || a2amqtt.ResultText(res) != want {
			t.Errorf("conversation %d (task %s) not resumed after the fault: %v, got %q want %q", i, c.task, err, a2amqtt.ResultText(res), want)
		}
	}
}

// The broker restarts three times under load (SIGTERM, then a crash with SIGKILL, then SIGTERM;
// 2 s down each time; persistence and dynsec state on its volume), each time with conversations
// waiting in input-required; they are answered after the restart and must complete.
func TestBrokerRestartMidConversation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	broker := f.Pods[installed.Broker][0]
	l := f.startLoad(4)
	started := time.Now()
	var lastFault time.Time
	for round, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGTERM} {
		convs := openConversations(ctx, t, f, 5)
		time.Sleep(2 * time.Second)
		broker.StopContainer("mosquitto", sig)
		time.Sleep(2 * time.Second)
		lastFault = time.Now()
		if err := broker.StartContainer(ctx, "mosquitto"); err != nil {
			t.Fatal(err)
		}
		took := f.waitServing(ctx, 2*time.Minute)
		t.Logf("round %d (%s): both agents answer %.1fs after the broker came back", round+1, sig, took.Seconds())
		resume(ctx, t, f, convs)
		time.Sleep(3 * time.Second)
	}
	rep := l.stop("broker restart ×3 (SIGTERM, SIGKILL, SIGTERM) mid-conversation", started, lastFault)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

type fleetInput struct {
	objs []*unstructured.Unstructured
}

// The broker loses its whole state (a new, empty volume: no dynsec identities, no retained cards,
// no sessions) and starts again; its init container initialises dynsec with the admin of the
// Secret. The operator notices (its state-loss sentinel, at the admin reconnect), says so in the
// Agents' status (ACLsSynced and Ready False), registers every identity again (the agents'
// clients and roles, the shared unit/org/gate roles and groups, the service's and its own),
// republishes the cards, and every client comes back without a restart.
func TestBrokerRestartWithEmptyState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	before, err := f.brokerState()
	if err != nil {
		t.Fatal(err)
	}
	conditions := f.watchConditions(ctx)
	l := f.startLoad(3)
	started := time.Now()
	time.Sleep(3 * time.Second)

	old := f.Pods[installed.Broker][0]
	old.Delete()
	claim := f.Cluster.ClaimDir(installed.Namespace, brokerClaim)
	entries, err := os.ReadDir(claim)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(claim, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	fault := time.Now()
	broker, err := f.Cluster.StartPod(ctx, installed.Namespace, installed.Broker, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Pods[installed.Broker][0] = broker
	if err := broker.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker %s started on an empty volume (dynsec initialised again) %.1fs after the old one went", broker.Name, time.Since(fault).Seconds())
	f.waitServing(ctx, 2*time.Minute)
	t.Logf("both agents answer %.1fs after the broker lost its state", time.Since(fault).Seconds())

	// Everything the operator had put on the broker is back, identically (clients with their
	// roles and groups, every role's ACLs, the shared groups' members).
	var missing []string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		after, err := f.brokerState()
		if err == nil {
			if missing = missingFrom(before, after); len(missing) == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker state not restored 2 minutes after the loss (%v): %d of %d entries differ:\n%s", err, len(missing), len(before), strings.Join(missing, "\n"))
		}
	}
	t.Logf("all %d dynsec clients, groups and roles back %.1fs after the loss", len(before), time.Since(fault).Seconds())
	f.WaitAgentsReady(ctx, chaosNS, 2*time.Minute)
	conditions.checkFlipped(t, fault, "client", "direct", "gated")

	time.Sleep(5 * time.Second) // traffic after the recovery counts too
	rep := l.stop("broker restart with empty state (new volume)", started, fault)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}
