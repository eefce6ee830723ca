package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// steppedReplica is a gateway replica's bus side whose ring and syncs the test drives (Tick,
// Sync): the test decides which replica has read the Leases when.
type steppedReplica struct {
	ring *gateway.Ring
	out  *gateway.Outbound
}

func (st *stack) steppedReplica(t testing.TB, ctx context.Context, id string) *steppedReplica {
	t.Helper()
	reader, leases := st.ringClients(t, ctx)
	log := replicaLogger(id)
	ring := gateway.NewRing(gateway.RingConfig{Client: leases, Namespace: st.ns, ReplicaID: id, Address: "http://" + id,
		TTL: 5 * time.Second, Logger: log})
	dir := &gateway.Directory{Reader: reader, Namespace: st.ns}
	out := gateway.NewOutbound(gateway.OutboundConfig{Conn: gateway.ConnConfig{BrokerURL: st.brokerURL, Logger: log}, Directory: dir, Ring: ring})
	t.Cleanup(func() { out.Close(context.Background()); ring.Leave(context.Background()) })
	return &steppedReplica{ring: ring, out: out}
}

func (r *steppedReplica) tick(t testing.TB, ctx context.Context) {
	t.Helper()
	if err := r.ring.Tick(ctx); err != nil {
		t.Fatal(err)
	}
}

func (r *steppedReplica) sync(t testing.TB, ctx context.Context) {
	t.Helper()
	if err := r.out.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// presenceChanges counts the presence the HTTP agent's own connections publish on its discovery
// topic (an online card at every connect, the LWT's offline card when a connection is cut),
// seen by a plain paho client: each takeover of its session shows there.
func (st *stack) presenceChanges(t testing.TB, agent string) func() int {
	t.Helper()
	u, err := url.Parse(st.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	watcher := brokertest.MustDial(t, u.Host, brokertest.Options{Username: st.usernames["mqttclient"], Password: st.passwords["mqttclient"],
		ClientID: ref("mqttclient").ClientID()})
	if rc := watcher.Subscribe(ref(agent).DiscoveryTopic()); rc >= 0x80 {
		t.Fatalf("subscribe to %s: %#x", ref(agent).DiscoveryTopic(), rc)
	}
	return func() int {
		n := 0
		for {
			select {
			case p := <-watcher.Messages():
				if src := p.Properties.User.Get(a2amqtt.PropStatusSource); src == a2amqtt.SourceAgent || src == a2amqtt.SourceLWT {
					n++
				}
			default:
				return n
			}
		}
	}
}

// TestATakenOverConnectionWaitsForTheRing: an HTTP agent's connection held by a gateway replica
// is taken over (another client connects with its client ID). It does not connect again on its
// own: it waits for the ring's next read of the Leases, and reconnects only if that view still
// assigns it the agent. The taker is first a plain paho client (the ring, read again, still
// assigns the agent to the replica, which then takes it back once), then a second replica that
// joined the ring and read the Leases before the first did (the first, having read them, lets
// the agent go and the two never take the session from each other in a loop).
func TestATakenOverConnectionWaitsForTheRing(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, agentURL := startPlanner(t)
		st := newStack(t, ctx, kind, agentURL)
		httpAgent := st.ns + "/httpagent"
		// newID wins the HTTP agent once both are live.
		newID, oldID := replicaIDs(ref("httpagent").ClientID())
		old := st.steppedReplica(t, ctx, oldID)
		old.sync(t, ctx)
		if held := old.out.Held(); len(held) != 0 {
			t.Errorf("before its ring read the Leases, the replica holds %v", held)
		}
		old.tick(t, ctx)
		old.sync(t, ctx)
		if held := old.out.Held(); !slices.Equal(held, []string{httpAgent}) {
			t.Fatalf("alone in the ring, the replica holds %v", held)
		}
		presence := st.presenceChanges(t, "httpagent")

		// 1. A plain paho client takes the session over. The replica's ring is not read
		// meanwhile: the taker keeps the connection.
		u, err := url.Parse(st.brokerURL)
		if err != nil {
			t.Fatal(err)
		}
		taker := brokertest.MustDial(t, u.Host, brokertest.Options{Username: st.usernames["httpagent"], Password: st.passwords["httpagent"],
			ClientID: ref("httpagent").ClientID(), IgnoreMessages: true})
		const quiet = 1500 * time.Millisecond
		if taker.Disconnected(quiet) {
			t.Errorf("the replica took the session back within %v without reading the ring", quiet)
		}
		// The ring, read again, still assigns the agent to the replica: it connects again.
		old.tick(t, ctx)
		if !taker.Disconnected(10 * time.Second) {
			t.Fatal("the replica did not take its agent back after its ring assigned it again")
		}

		// 2. A second replica joins and reads the Leases before the first does: it is assigned
		// the agent and takes the session over. The first does not take it back, neither before
		// its ring's next read nor after (that read assigns the agent to the second).
		testenv.Eventually(t, 10*time.Second, "the replica serves its agent again", func() error {
			return callHTTPAgent(ctx, st)
		})
		presence() // what part 1 left
		joined := st.steppedReplica(t, ctx, newID)
		joined.tick(t, ctx)
		joined.sync(t, ctx)
		if held := joined.out.Held(); !slices.Equal(held, []string{httpAgent}) {
			t.Fatalf("the joined replica holds %v", held)
		}
		time.Sleep(quiet)
		duringStale := presence()
		old.tick(t, ctx)
		old.sync(t, ctx)
		if held := old.out.Held(); len(held) != 0 {
			t.Fatalf("after reading the Leases the first replica still holds %v", held)
		}
		time.Sleep(quiet)
		after := presence()
		t.Logf("%s: presence changes while the first replica's view was stale: %d; after it let go: %d", kind, duringStale, after)
		// One takeover: the joined replica's online card and the cut connection's LWT (the
		// order and whether both show depend on the broker), nothing more.
		if duringStale > 2 || after > 1 {
			t.Fatalf("the two replicas took the session from each other: %d presence changes while the view was stale, %d after", duringStale, after)
		}
		if err := callHTTPAgent(ctx, st); err != nil {
			t.Fatalf("the agent through the joined replica: %v", err)
		}
	})
}

// callHTTPAgent sends the HTTP agent one request from an MQTT requester and checks its answer.
func callHTTPAgent(ctx context.Context, st *stack) error {
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := a2amqtt.Connect(callCtx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames["rawclient"],
		Password: st.passwords["rawclient"], Agent: ref("rawclient"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer func() { _ = req.Close(context.Background()) }()
	r, err := a2amqtt.NewRequester(callCtx, req, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 5 * time.Second, MaxAttempts: 1}})
	if err != nil {
		return err
	}
	res, err := r.Transport(ref("httpagent")).SendMessage(callCtx, nil, userMsg(uuid.NewString(), "", "deploy v3"))
	if err != nil {
		return err
	}
	if task, ok := res.(*a2a.Task); !ok || task.Status.State != a2a.TaskStateInputRequired {
		return fmt.Errorf("answer %#v", res)
	}
	return nil
}
