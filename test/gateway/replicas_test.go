package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// ringReplica is one in-process gateway replica in a ring (its Lease in the stack's namespace):
// its HTTP side on loopback, its bus side holding the HTTP agents the ring assigns it. stop ends
// it as a pod's SIGTERM does: it leaves the ring, cuts its HTTP connections and closes its MQTT
// connections.
type ringReplica struct {
	url  string
	ring *gateway.Ring
	pool *gateway.Pool
	out  *gateway.Outbound
	stop func()
}

// ringClients are what a replica of the ring reads with: the cached reader of Agents and
// Secrets, and a client of the Leases it writes its membership to.
func (st *stack) ringClients(t testing.TB, ctx context.Context) (client.Reader, client.Client) {
	t.Helper()
	reader, err := gateway.NewCachedReader(ctx, restCfg, st.ns)
	if err != nil {
		t.Fatalf("gateway reader: %v", err)
	}
	leases, err := client.New(restCfg, client.Options{Scheme: gateway.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return reader, leases
}

func (st *stack) ringReplica(t testing.TB, ctx context.Context, id string) *ringReplica {
	t.Helper()
	reader, leases := st.ringClients(t, ctx)
	var handler http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	log := replicaLogger(id)
	rctx, cancel := context.WithCancel(ctx)
	ring := gateway.NewRing(gateway.RingConfig{Client: leases, Namespace: st.ns, ReplicaID: id, Address: srv.URL,
		TTL: 5 * time.Second, Interval: 200 * time.Millisecond, Logger: log})
	dir := &gateway.Directory{Reader: reader, Namespace: st.ns}
	conn := gateway.ConnConfig{BrokerURL: st.brokerURL, Logger: log,
		Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 10 * time.Second, MaxAttempts: 1}}
	pool := gateway.NewPool(conn, dir)
	handler = gateway.NewInbound(gateway.InboundConfig{Directory: dir, Pool: pool, BrokerURL: st.brokerURL, Ring: ring,
		Auth: &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()}, Logger: log})
	out := gateway.NewOutbound(gateway.OutboundConfig{Conn: conn, Directory: dir, Ring: ring})
	ring.Follow(rctx, pool, out)
	ringDone, outDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(ringDone); ring.Run(rctx) }()
	go func() { defer close(outDone); out.Run(rctx, 500*time.Millisecond) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-ringDone
		srv.CloseClientConnections()
		srv.Close()
		<-outDone
		pool.Close(context.Background())
	}
	t.Cleanup(stop)
	return &ringReplica{url: srv.URL, ring: ring, pool: pool, out: out, stop: stop}
}

// replicaIDs returns two replica names such that, while both are live, the first is assigned
// both keys: the test then knows which replica's stop moves them.
func replicaIDs(keys ...string) (string, string) {
	for i := 0; ; i++ {
		a, b := fmt.Sprintf("gw-a-%d", i), fmt.Sprintf("gw-b-%d", i)
		members := []gateway.Member{{ID: a}, {ID: b}}
		if !slices.ContainsFunc(keys, func(k string) bool { return gateway.RendezvousOwner(k, members).ID != a }) {
			return a, b
		}
	}
}

// TestTwoReplicasShareTheIdentities: two gateway replicas in a ring. The HTTP agent is held by
// one of them only (one MQTT session per identity), and an HTTP request that reaches the other
// is forwarded to the replica serving its caller (only that one connects as the caller). That
// replica stops during an HTTP stream: the stream is cut, the caller reads the task to its end
// with GetTask through the survivor, and an MQTT requester calls the HTTP agent, now held by the
// survivor.
func TestTwoReplicasShareTheIdentities(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, agentURL := startPlanner(t)
		st := newStack(t, ctx, kind, agentURL)
		st.startMQTTAgent(t, ctx, "memory", true, 2*time.Second)
		idA, idB := replicaIDs(ref("client").ClientID(), ref("httpagent").ClientID())
		presence := st.presenceChanges(t, "httpagent")
		a, b := st.ringReplica(t, ctx, idA), st.ringReplica(t, ctx, idB)
		httpAgent := st.ns + "/httpagent"
		testenv.Eventually(t, 30*time.Second, "both replicas see each other; only A holds the HTTP agent", func() error {
			if len(a.ring.Members()) != 2 || len(b.ring.Members()) != 2 {
				return fmt.Errorf("members: A %v, B %v", a.ring.Members(), b.ring.Members())
			}
			if ha, hb := a.out.Held(), b.out.Held(); !slices.Equal(ha, []string{httpAgent}) || len(hb) != 0 {
				return fmt.Errorf("held: A %v, B %v", ha, hb)
			}
			return nil
		})
		// The replicas started together: at most one of them held the agent before both had
		// read the Leases, and was taken over once by A (its online card, A's, its LWT); two
		// replicas taking the session from each other in turn show many more.
		time.Sleep(time.Second)
		startPresence := presence()
		if startPresence > 3 {
			t.Errorf("the HTTP agent's presence changed %d times while the two replicas started (a takeover loop)", startPresence)
		}
		tr := st.requesterAs(t, ctx, "mqttclient").Transport(ref("httpagent"))
		if plan := taskOf(t)(tr.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "deploy v1"))); plan.Status.State != a2a.TaskStateInputRequired {
			t.Fatalf("outbound through A: %s %q", plan.Status.State, said(plan))
		}

		// Inbound through B: forwarded to A, which alone connects as the caller.
		token := st.token(t, ctx, "caller")
		viaB, _ := httpClient(t, ctx, b.url, "memory", token)
		var taskID a2a.TaskID
		var last a2a.Event
		var stoppedAt time.Time
		heldByB := make(chan time.Duration, 1)
		for ev, err := range viaB.SendStreamingMessage(ctx, userMsg(uuid.NewString(), "", "a long one")) {
			if err != nil {
				break
			}
			last = ev
			if taskID == "" {
				taskID = ev.TaskInfo().TaskID
				if a.pool.Size() != 1 || b.pool.Size() != 0 {
					t.Fatalf("caller connections: A %d, B %d; want the caller on A only", a.pool.Size(), b.pool.Size())
				}
				stoppedAt = time.Now()
				go func() {
					for ctx.Err() == nil && !slices.Equal(b.out.Held(), []string{httpAgent}) {
						time.Sleep(10 * time.Millisecond)
					}
					heldByB <- time.Since(stoppedAt)
				}()
				a.stop() // A stops after the stream's first event
			}
		}
		if taskID == "" {
			t.Fatal("the stream gave no event")
		}
		if su, ok := last.(*a2a.TaskStatusUpdateEvent); ok && su.Status.State.Terminal() {
			t.Fatalf("the stream reached its end (%s) although its replica stopped", su.Status.State)
		}

		var inboundBack time.Duration
		testenv.Eventually(t, 30*time.Second, "the task completes, read through B", func() error {
			task, err := viaB.GetTask(ctx, &a2a.GetTaskRequest{ID: taskID})
			if err != nil {
				return err
			}
			if inboundBack == 0 {
				inboundBack = time.Since(stoppedAt)
			}
			if task.Status.State != a2a.TaskStateCompleted || !strings.Contains(said(task), "a long one") {
				return fmt.Errorf("%s %q", task.Status.State, said(task))
			}
			return nil
		})
		if b.pool.Size() != 1 {
			t.Fatalf("B holds %d caller connections, want 1 (it took the caller over)", b.pool.Size())
		}
		// B holding the agent and the agent answering are checked together: a reply alone could
		// still come from a connection B was letting go of.
		notHeld := 0
		testenv.Eventually(t, 30*time.Second, "B holds the HTTP agent, which answers", func() error {
			if held := b.out.Held(); !slices.Equal(held, []string{httpAgent}) {
				notHeld++
				return fmt.Errorf("B holds %v", held)
			}
			callCtx, cancelCall := context.WithTimeout(ctx, 5*time.Second)
			defer cancelCall()
			res, err := tr.SendMessage(callCtx, nil, userMsg(uuid.NewString(), "", "deploy v2"))
			if err != nil {
				return err
			}
			if task, ok := res.(*a2a.Task); !ok || task.Status.State != a2a.TaskStateInputRequired {
				return fmt.Errorf("answer %#v", res)
			}
			return nil
		})
		if held := b.out.Held(); !slices.Equal(held, []string{httpAgent}) {
			t.Fatalf("B holds %v after the agent answered through it", held)
		}
		t.Logf("presence changes while the replicas started: %d; after A stopped: the first GetTask answered through B in %v; B held the HTTP agent after %v (seen not holding it %d times before)", startPresence, inboundBack, <-heldByB, notHeld)
	})
}

// TestRingMembership: a replica is a member while its Lease is renewed; one that stops renewing
// (a crash) leaves the others' view once its Lease expires, one that leaves (a clean stop) at
// their next read; the listeners hear each change.
func TestRingMembership(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := cp.NewNamespace(t, ctx, "gw-ring-")
	leases, err := client.New(restCfg, client.Options{Scheme: gateway.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	newRing := func(id string) *gateway.Ring {
		return gateway.NewRing(gateway.RingConfig{Client: leases, Namespace: ns, ReplicaID: id, Address: "http://" + id,
			TTL: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	}
	a, b, c := newRing("a"), newRing("b"), newRing("c")
	var changes atomic.Int32
	b.OnChange(func() { changes.Add(1) })
	ids := func(r *gateway.Ring) []string {
		var out []string
		for _, m := range r.Members() {
			out = append(out, m.ID)
		}
		return out
	}
	tick := func(rs ...*gateway.Ring) {
		for _, r := range rs {
			if err := r.Tick(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	tick(a, b, c)
	tick(a, b, c)
	if got := ids(b); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("members %v", got)
	}
	if b.Members()[0].Address != "http://a" || changes.Load() == 0 {
		t.Fatalf("members %+v, %d changes", b.Members(), changes.Load())
	}
	// c stops cleanly: gone at b's next read.
	c.Leave(ctx)
	tick(b)
	if got := ids(b); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("after c left: %v", got)
	}
	// a crashes (stops renewing): gone once its Lease expires, not before.
	crashed := time.Now()
	tick(b)
	if got := ids(b); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("right after a stopped renewing: %v", got)
	}
	testenv.Eventually(t, 10*time.Second, "a's Lease expires", func() error {
		tick(b)
		if got := ids(b); !slices.Equal(got, []string{"b"}) {
			return fmt.Errorf("members %v", got)
		}
		return nil
	})
	t.Logf("a crashed replica left the ring after %v (TTL 2 s)", time.Since(crashed))
	if owner := b.Owner("acme/sales/anything"); owner.ID != "b" {
		t.Fatalf("alone, b is assigned %v", owner)
	}
}

// replicaLogger is a replica's logger: silent, or on stderr at debug level when GW_DEBUG is set
// (to read a failing run's connections and ring changes).
func replicaLogger(id string) *slog.Logger {
	if os.Getenv("GW_DEBUG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", id)
}

// TestRingViewIsFresh: a ring is not ready (it sees only its own replica) until it has read the
// Leases once; OwnsAfterRead answers from a read begun after the call, not from the view before.
func TestRingViewIsFresh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := cp.NewNamespace(t, ctx, "gw-fresh-")
	leases, err := client.New(restCfg, client.Options{Scheme: gateway.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	newRing := func(id string) *gateway.Ring {
		return gateway.NewRing(gateway.RingConfig{Client: leases, Namespace: ns, ReplicaID: id, Address: "http://" + id,
			TTL: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	}
	key := "acme/sales/httpagent"
	winner, loser := replicaIDs(key)
	a, b := newRing(loser), newRing(winner)
	var changes atomic.Int32
	a.OnChange(func() { changes.Add(1) })
	if a.Ready() || !a.Owns(key) {
		t.Fatalf("before any read: ready %v, owns %v (want not ready, and alone it is assigned everything)", a.Ready(), a.Owns(key))
	}
	if err := a.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Ready() || changes.Load() != 1 {
		t.Fatalf("after the first read: ready %v, %d changes (the first read is one)", a.Ready(), changes.Load())
	}
	// b joins; a has not read since: its view says a owns the key, a fresh one says b.
	if err := b.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Owns(key) {
		t.Fatal("a's view changed without a read")
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := a.OwnsAfterRead(short, key); err == nil {
		t.Fatal("OwnsAfterRead answered without a read")
	}
	cancelShort()
	got := make(chan bool, 1)
	go func() {
		owns, err := a.OwnsAfterRead(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- owns
	}()
	// Read until the waiter has its answer (it wants a read begun after its call).
	for {
		if err := a.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case owns := <-got:
			if owns {
				t.Fatalf("a fresh read assigns %s to a, want b (%s)", key, winner)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
