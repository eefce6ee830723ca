package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// The service's per-caller rate in these tests: far below what one sequential caller sends on
// loopback, so the limiter engages on any machine.
const (
	testCallerRate  = 5
	testCallerBurst = 2
)

// TestSequentialCallersOverTheRate: two callers each send conversations to the governed memory
// sample one turn at a time, as fast as it answers: faster than their rate, so the service
// refuses part of their requests (its rate_limited counter moves). No call fails: the SDK waits
// each refusal's retry_after and sends the request again. No task fails either: the memory
// sample reads each conversation's history from the service under its own identity, twice the
// callers' rate together, and those reads of its own conversations are not charged to a
// caller's rate. Before, the SDK returned ErrRateLimited to the application, and the agent's
// history read was refused under its identity's caller rate and failed its task ("read the
// conversation so far: ... rate_limited").
//
// Then a caller that keeps exceeding the rate with calls whose deadline is shorter than the
// retry_after it is given still gets ErrRateLimited, carrying retry_after.
func TestSequentialCallersOverTheRate(t *testing.T) {
	onBothBrokers(t, sequentialCallersOverTheRate)
}

func sequentialCallersOverTheRate(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	// The memory sample reads message content from the service (history mode Messages).
	(&unstructuredPolicy{name: "governed", ns: st.ns}).patch(t, ctx, `{"spec":{"history":{"mode":"Messages"}}}`)
	eventually(t, 30*time.Second, "the policy's history mode stored", func() error {
		p := &a2av1.ConversationPolicy{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: "governed"}, p); err != nil {
			return err
		}
		if p.Spec.History == nil || p.Spec.History.Mode != a2av1.HistoryMessages {
			return fmt.Errorf("history %+v", p.Spec.History)
		}
		return nil
	})
	svc := st.startServiceCfg(t, ctx, &clock{}, "r1", func(c *convservice.Config) {
		c.CallerRate, c.CallerBurst = testCallerRate, testCallerBurst
		c.AgentHistoryRate, c.AgentHistoryBurst = 0, 0 // the defaults
	})
	memory := startMemorySample(t, ctx, st)
	limited := func() float64 {
		return counter(t, svc.Registry(), "a2a_conversation_rejections_total", "reason", rpcerr.NameRateLimited)
	}

	const contexts, turns = 5, 3
	callers := []string{"client", "direct"}
	requesters := make([]*a2amqtt.Requester, len(callers))
	for i, name := range callers {
		requesters[i] = st.requesterAs(t, ctx, name)
	}
	var mu sync.Mutex
	var failures []string
	calls := 0
	began := time.Now()
	var wg sync.WaitGroup
	for i, r := range requesters {
		wg.Go(func() {
			tr := r.Transport(ref("memory"))
			for c := range contexts {
				contextID := uuid.NewString()
				for turn := 1; turn <= turns; turn++ {
					callCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
					res, err := send(callCtx, tr, uuid.NewString(), contextID, fmt.Sprintf("%s context %d turn %d", callers[i], c, turn))
					cancel()
					why := ""
					switch {
					case err != nil:
						why = err.Error()
					case state(res) != a2a.TaskStateCompleted:
						why = fmt.Sprintf("task %s: %s", state(res), statusText(res))
					case !strings.Contains(statusText(res), fmt.Sprintf("Turn %d.", turn)):
						why = fmt.Sprintf("turn %d answered %q: the history read missed earlier turns", turn, statusText(res))
					}
					mu.Lock()
					calls++
					if why != "" {
						failures = append(failures, fmt.Sprintf("%s, context %d, turn %d: %s", callers[i], c, turn, why))
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	var retries uint64
	for _, r := range requesters {
		retries += r.RateLimitRetries()
	}
	t.Logf("%s: %d calls in %s (%.1f/s for %d callers at %d/s each), %d failed; %.0f refused rate_limited, %d SDK retries; the memory sample's history reads retried %d times",
		kind, calls, took.Round(time.Millisecond), float64(calls)/took.Seconds(), len(callers), testCallerRate, len(failures), limited(), retries, memory.Responder.HistoryRateLimitRetries())
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed, want 0:\n%s", len(failures), calls, strings.Join(failures, "\n"))
	}
	if limited() == 0 || retries == 0 {
		t.Fatalf("the limiter never engaged (%.0f refused, %d retries): the test does not show that refusals are waited out", limited(), retries)
	}

	// A caller over its rate whose calls' deadline is shorter than the retry_after it is given.
	impatient := st.requesterAs(t, ctx, "confirm").Transport(ref("memory"))
	var refusal error
	for i := 0; i < 50 && refusal == nil; i++ {
		callCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := send(callCtx, impatient, uuid.NewString(), uuid.NewString(), "now")
		cancel()
		if errors.Is(err, a2amqtt.ErrRateLimited) {
			refusal = err
		}
	}
	if refusal == nil {
		t.Fatalf("50 calls at full speed with a 100ms deadline against %d/s (retry_after up to %s): none returned ErrRateLimited", testCallerRate, time.Second/testCallerRate)
	}
	if after, ok := a2amqtt.RetryAfterOf(refusal); !ok || after <= 0 {
		t.Fatalf("the refusal %v carries no retry_after (%s, %v)", refusal, after, ok)
	}
	t.Logf("past its deadline: %v", refusal)
}

// startMemorySample runs the memory example agent as its sample deployment does behind the
// service: reading its delivery topic, and the conversation so far from the service.
func startMemorySample(t testing.TB, ctx context.Context, st *stack) *agents.Agent {
	t.Helper()
	id := ref("memory")
	delivery := identity.DeliveryTopic(id)
	a, err := agents.Start(ctx, agents.KindMemory, agents.Options{
		BrokerURL: st.brokerURL, Username: st.usernames["memory"], Password: st.passwords["memory"],
		Agent: id, RequestTopic: delivery, HistoryFrom: agents.GovernedHistory(agents.KindMemory, delivery),
	})
	if err != nil {
		t.Fatalf("start the memory sample: %v", err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

// statusText is the text of a task result's status message.
func statusText(res a2a.SendMessageResult) string {
	if t, ok := res.(*a2a.Task); ok && t.Status.Message != nil {
		return a2amqtt.TextOf(t.Status.Message)
	}
	return ""
}

// BenchmarkCallerRate measures what the default per-caller rate is sized from
// (docs/conversation-service.md, "Limits"): on the embedded broker, with the limit off, what one
// sequential SDK caller sends to the governed memory sample (each turn waiting for its answer,
// the sample reading the conversation so far from the service), and what the replica serves
// from E2E_BENCH_CALLERS (default 10) such callers at once (five identities, two requesters
// each). Both in one run; the figure that matters is their ratio: how many callers at full speed
// one replica carries. The store is bbolt without fsync; E2E_BENCH_FSYNC=1 makes every turn
// durable as in production.
//
//	… go test ./test/e2e/ -run '^$' -bench BenchmarkCallerRate -benchtime 1x
func BenchmarkCallerRate(b *testing.B) {
	const turns = 5 // per conversation
	calls := 1000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st := newStack(b, ctx, "embedded")
	st.startServiceCfg(b, ctx, &clock{}, "bench", func(c *convservice.Config) {
		c.Logger, c.BoltNoSync = benchLogger(), os.Getenv("E2E_BENCH_FSYNC") != "1"
	})
	startMemorySample(b, ctx, st)
	identities := []string{"client", "direct", "confirm", "raw", "guarded"}
	requesters := map[string][]*a2amqtt.Requester{}
	for _, name := range identities {
		first := st.requesterAs(b, ctx, name) // one connection per identity (its client id)
		second, err := a2amqtt.NewRequester(ctx, first.Conn(), a2amqtt.RequesterOptions{})
		if err != nil {
			b.Fatal(err)
		}
		requesters[name] = []*a2amqtt.Requester{first, second}
	}
	run := func(tr *a2amqtt.Transport, n int) []time.Duration {
		var took []time.Duration
		var contextID string
		for i := range n {
			if i%turns == 0 {
				contextID = uuid.NewString()
			}
			began := time.Now()
			res, err := send(ctx, tr, uuid.NewString(), contextID, "turn")
			if err != nil || state(res) != a2a.TaskStateCompleted {
				b.Fatalf("call %d: %v %v", i, err, state(res))
			}
			took = append(took, time.Since(began))
		}
		return took
	}
	b.ResetTimer()
	for range b.N {
		b.Logf("load average before: %s", hostload.Average())
		one := requesters["client"][0].Transport(ref("memory"))
		run(one, 50) // warm up
		began := time.Now()
		seq := run(one, calls)
		seqRate := float64(calls) / time.Since(began).Seconds()
		slices.Sort(seq)

		began = time.Now()
		var wg sync.WaitGroup
		parallel := 0
		for _, name := range identities {
			for _, r := range requesters[name] {
				parallel++
				wg.Go(func() { run(r.Transport(ref("memory")), calls/5) })
			}
		}
		wg.Wait()
		replicaRate := float64(parallel*calls/5) / time.Since(began).Seconds()
		b.Logf("one sequential caller: %.0f calls/s (p50 %s, p90 %s); %d callers at once: %.0f calls/s (%.1f sequential callers' worth); load average %s",
			seqRate, seq[len(seq)/2].Round(10*time.Microsecond), seq[len(seq)*9/10].Round(10*time.Microsecond), parallel, replicaRate, replicaRate/seqRate, hostload.Average())
		b.ReportMetric(seqRate, "sequential-calls/s")
		b.ReportMetric(replicaRate, "replica-calls/s")
	}
}
