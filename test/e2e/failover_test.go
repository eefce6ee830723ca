package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/redistest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestRedisFailoverUnderLoad: the conversation service's state on a Sentinel-managed Redis (a
// primary, two replicas, three sentinels; redis+sentinel:// store, commits acknowledged by one
// replica) loses nothing when the primary goes. Two service replicas (processes, each owning one
// of the two governed agents) serve four requesters sending single-turn requests and one
// conversation of back-to-back turns under maxConcurrentTasksPerContext 1 (a turn whose
// completion the failover lost would leave the slot held: the next turn would be refused).
//
//   - "kill -9": the primary is killed, later restarted (empty: no persistence) and must rejoin
//     as a replica of the promoted one.
//   - "network cut": the primary runs in a network namespace of its own (redistest.Netns, a veth
//     pair in 198.18.64.0/18, clear of routed networks); every packet on its link is dropped (nothing refuses, nothing
//     answers, established connections hang), later let through again, and it must be turned
//     into a replica of the promoted one.
//
// The bar, per scenario: no request lost (no reply after the SDK's retries), none executed twice
// (the agents' own record), none answered with another's answer, every error a -32004
// responder_unavailable (the service refusing what it cannot make durable) during the failover,
// and the agents served again within seconds. The figures are printed as "chaos result:" lines
// (docs/reliability.md, "Redis failover").
func TestRedisFailoverUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "mosquitto")
	agents := map[string]*rawAgent{}
	for _, name := range []string{"raw", "guarded"} {
		agents[name] = startRawAgent(t, ctx, st.addr, st.usernames[name], st.passwords[name], ref(name), identity.DeliveryTopic(ref(name)))
	}
	r := st.requester(t, ctx)
	t.Run("kill -9", func(t *testing.T) { redisFailover(t, ctx, st, r, agents, false) })
	t.Run("network cut", func(t *testing.T) {
		if why := redistest.CanNetns(); why != "" {
			t.Skipf("the network cut needs a network namespace: %s", why)
		}
		redisFailover(t, ctx, st, r, agents, true)
	})
}

// failoverOutcome is one request of the load.
type failoverOutcome struct {
	start, end time.Time
	kind       string // completed, errored, lost, mismatched
	code       int    // JSON-RPC error code of an errored request
	detail     string
}

type failoverLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    []failoverOutcome
}

func (l *failoverLoad) record(o failoverOutcome) {
	l.mu.Lock()
	l.out = append(l.out, o)
	l.mu.Unlock()
}

func (l *failoverLoad) snapshot() []failoverOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.out)
}

// startFailoverLoad runs workers single-turn requesters alternating between targets, and one
// conversation of back-to-back turns with limited (maxConcurrentTasksPerContext 1), all with the
// SDK's default retry policy (first reply 15 s, 3 attempts).
func startFailoverLoad(ctx context.Context, r *a2amqtt.Requester, targets []a2amqtt.AgentRef, limited a2amqtt.AgentRef, workers int) *failoverLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &failoverLoad{cancel: cancel}
	classify := func(start time.Time, res a2a.SendMessageResult, err error, want string) failoverOutcome {
		o := failoverOutcome{start: start, end: time.Now()}
		switch {
		case errors.Is(err, a2amqtt.ErrNoReply):
			o.kind, o.detail = "lost", err.Error()
		case err != nil:
			o.kind, o.detail = "errored", err.Error()
			o.code, _ = rpcCode(err)
		case state(res) != a2a.TaskStateCompleted || a2amqtt.ResultText(res) != want:
			o.kind, o.detail = "mismatched", fmt.Sprintf("%s %q", state(res), a2amqtt.ResultText(res))
		default:
			o.kind = "completed"
		}
		return o
	}
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				text := fmt.Sprintf("req-%d-%d", w, i)
				start := time.Now()
				res, err := send(ctx, r.Transport(targets[i%len(targets)]), uuid.NewString(), uuid.NewString(), text)
				if ctx.Err() != nil {
					return
				}
				l.record(classify(start, res, err, "echo: "+text))
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	l.wg.Go(func() {
		conv := uuid.NewString()
		for i := 0; ctx.Err() == nil; i++ {
			text := fmt.Sprintf("turn-%d", i)
			start := time.Now()
			res, err := send(ctx, r.Transport(limited), uuid.NewString(), conv, text)
			if ctx.Err() != nil {
				return
			}
			o := classify(start, res, err, "echo: "+text)
			l.record(o)
			if o.kind != "completed" {
				time.Sleep(100 * time.Millisecond)
			}
		}
	})
	return l
}

func (l *failoverLoad) stop() []failoverOutcome {
	l.cancel()
	l.wg.Wait()
	return l.snapshot()
}

func redisFailover(t *testing.T, ctx context.Context, st *stack, r *a2amqtt.Requester, agents map[string]*rawAgent, cut bool) {
	// down-after 2 s: with 1 s a promoted replica that answered one ping late on this loaded
	// 2-core machine was failed over again a second later (seen: a second, spurious failover;
	// served through, but the test then looked for the wrong primary). Production: 5 s or more.
	set := redistest.StartSentinelSet(t, redistest.SentinelOptions{PrimaryInNetns: cut, DownAfter: 2 * time.Second,
		// A primary cut off from its replicas stops taking writes after 10 s (the server's own
		// guard against a split brain; the service's WAIT refuses them at once).
		ServerArgs: []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"}})
	store := set.StoreURL("")
	// Two replica ids that the assignment splits between the agents.
	targets := []a2amqtt.AgentRef{ref("raw"), ref("guarded")}
	var pair []string
	for i := 0; len(pair) == 0 && i < 100; i++ {
		live := []string{fmt.Sprintf("fo%v-x%d", cut, i), fmt.Sprintf("fo%v-y%d", cut, i)}
		if convservice.AssignedReplica(targets[0].String(), live) != convservice.AssignedReplica(targets[1].String(), live) {
			pair = live
		}
	}
	for _, id := range pair {
		st.spawnService(t, id, store)
	}
	for _, a := range targets {
		eventually(t, 30*time.Second, a.Agent+" served", func() error {
			_, err := send(ctx, r.Transport(a), uuid.NewString(), uuid.NewString(), "warm")
			return err
		})
	}
	seen := map[string]int{}
	for name, a := range agents {
		seen[name] = len(a.received())
	}

	load := startFailoverLoad(ctx, r, targets, ref("guarded"), 4)
	time.Sleep(3 * time.Second)
	old := set.Primary
	if cut {
		set.Netns.Cut()
	} else {
		old.Kill()
	}
	// The fault is in place (the packets dropped, the process gone).
	fault := time.Now()
	// The failover: when a majority of the sentinels name another primary.
	var promoted string
	eventually(t, 60*time.Second, "a replica promoted", func() error {
		addr, err := set.PrimaryAddr(ctx)
		if err != nil {
			return err
		}
		if addr == old.Addr() {
			return fmt.Errorf("the sentinels still name %s", addr)
		}
		promoted = addr
		return nil
	})
	failedOver := time.Since(fault)
	// Every change of primary from here on (a second failover is the sentinels' right): the
	// failover window ends at the last one.
	var (
		switchMu  sync.Mutex
		switches  = []time.Time{fault.Add(failedOver)}
		lastKnown = promoted
	)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			if addr, err := set.PrimaryAddr(watchCtx); err == nil && addr != lastKnown {
				switchMu.Lock()
				lastKnown = addr
				switches = append(switches, time.Now())
				switchMu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	current := func() string { switchMu.Lock(); defer switchMu.Unlock(); return lastKnown }
	// Served again: a request of each kind started after the failover completed.
	eventually(t, 60*time.Second, "served after the failover", func() error {
		n := 0
		for _, o := range load.snapshot() {
			if o.kind == "completed" && o.start.After(fault.Add(failedOver)) {
				n++
			}
		}
		if n < 20 {
			return fmt.Errorf("%d requests completed since the failover", n)
		}
		return nil
	})
	time.Sleep(3 * time.Second) // traffic on the promoted primary
	back := time.Now()
	if cut {
		set.Netns.Heal()
	} else {
		old.Restart()
	}
	eventually(t, 90*time.Second, "the old primary rejoins as a replica of the primary", func() error {
		role, primary, up, err := old.Role(ctx)
		if err != nil {
			return err
		}
		if now := current(); role != "slave" || primary != now || !up {
			return fmt.Errorf("role %s of %s, link up %v; the sentinels name %s", role, primary, up, now)
		}
		return nil
	})
	rejoined := time.Since(back)
	time.Sleep(2 * time.Second) // traffic with the old primary back as a replica
	out := load.stop()
	stopWatch()
	<-watched
	lastSwitch := switches[len(switches)-1]

	// The figures.
	counts := map[string]int{}
	codes := map[string]int{}
	var servedAgain time.Duration = -1
	var windowFirst, windowLast time.Time
	for _, o := range out {
		counts[o.kind]++
		if o.kind == "errored" {
			msg := o.detail
			if len(msg) > 110 {
				msg = msg[:110]
			}
			codes[fmt.Sprintf("%d %s", o.code, msg)]++
			if windowFirst.IsZero() || o.start.Before(windowFirst) {
				windowFirst = o.start
			}
			if o.end.After(windowLast) {
				windowLast = o.end
			}
		}
		if o.kind == "completed" && o.start.After(fault) && (servedAgain < 0 || o.end.Sub(fault) < servedAgain) {
			servedAgain = o.end.Sub(fault)
		}
	}
	longest := time.Duration(0)
	for _, o := range out {
		if o.kind == "completed" && o.end.After(fault) && o.start.Before(fault.Add(failedOver+5*time.Second)) {
			longest = max(longest, o.end.Sub(o.start))
		}
	}
	dup := 0
	for name, a := range agents {
		ids := map[string]int{}
		for _, p := range a.received()[seen[name]:] {
			var req struct {
				Params struct {
					Message struct {
						MessageID string `json:"messageId"`
					} `json:"message"`
				} `json:"params"`
			}
			if json.Unmarshal(p.Payload, &req) == nil && req.Params.Message.MessageID != "" {
				ids[req.Params.Message.MessageID]++
			}
		}
		for _, n := range ids {
			if n > 1 {
				dup += n - 1
			}
		}
	}
	var errs []string
	for m, n := range codes {
		errs = append(errs, fmt.Sprintf("%d× %s", n, m))
	}
	sort.Strings(errs)
	scenario := map[bool]string{false: "Redis primary kill -9", true: "Redis primary network cut"}[cut]
	window := "none"
	if !windowFirst.IsZero() {
		window = fmt.Sprintf("%s to %s after the fault", windowFirst.Sub(fault).Round(10*time.Millisecond), windowLast.Sub(fault).Round(10*time.Millisecond))
	}
	t.Logf("chaos result: %s (sentinel set, 2 service replicas): %d requests, %d completed, %d errored, %d lost, %d duplicated, %d mismatched; "+
		"promoted after %s (%d failover(s) in all); first request started after the fault completed %s after it; longest request across the failover %s; errors %s; old primary back as a replica %s after it returned",
		scenario, len(out), counts["completed"], counts["errored"], counts["lost"], dup, counts["mismatched"],
		failedOver.Round(10*time.Millisecond), len(switches), servedAgain.Round(10*time.Millisecond), longest.Round(10*time.Millisecond), window, rejoined.Round(10*time.Millisecond))
	if len(errs) > 0 {
		t.Logf("errors: %s", strings.Join(errs, "; "))
	}

	// The bar.
	if counts["lost"] > 0 || counts["mismatched"] > 0 || dup > 0 {
		for _, o := range out {
			if o.kind == "lost" || o.kind == "mismatched" {
				t.Logf("%s: started %s after the fault: %s", o.kind, o.start.Sub(fault).Round(time.Millisecond), o.detail)
			}
		}
		t.Errorf("lost %d, mismatched %d, duplicated %d: want 0", counts["lost"], counts["mismatched"], dup)
	}
	for _, o := range out {
		if o.kind != "errored" {
			continue
		}
		if o.code != a2amqtt.CodeResponderUnavailable {
			t.Errorf("error other than -32004 (started %s after the fault): %s", o.start.Sub(fault).Round(time.Millisecond), o.detail)
		}
		// The failover window: from the fault until the (last) promotion, plus the time a
		// request already waiting on the old primary takes to give up (the store's commit
		// timeout, 10 s), plus the SDK's retries of that request.
		if o.start.Before(fault.Add(-time.Second)) || o.start.After(lastSwitch.Add(15*time.Second)) {
			t.Errorf("error outside the failover window (started %s after the fault, last promotion %s after it): %s",
				o.start.Sub(fault).Round(time.Millisecond), lastSwitch.Sub(fault).Round(time.Millisecond), o.detail)
		}
	}
	if counts["completed"] == 0 || servedAgain < 0 {
		t.Fatal("nothing completed after the fault: the test shows nothing")
	}
	if servedAgain > 30*time.Second {
		t.Errorf("served again %s after the fault, want within 30 s", servedAgain)
	}
}
