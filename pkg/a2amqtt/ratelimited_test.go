package a2amqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// limitingGate answers agentB's requests on plain paho (not this SDK) the way a2a-fleet's
// conversation service answers a caller over its rate: the first `refuse` requests (every one
// when refuse < 0) get -32070 rate_limited with retry_after, the rest a completed task.
type limitingGate struct {
	retryAfter float64

	mu       sync.Mutex
	refuse   int
	requests []gateRequest
}

// gateRequest is what the gate saw of one publish.
type gateRequest struct {
	at       time.Time
	rpcID    string
	taskID   string
	corr     string
	refused  bool
	answered time.Time
}

func startLimitingGate(t *testing.T, b brokertest.Broker, refuse int, retryAfter float64) *limitingGate {
	t.Helper()
	g := &limitingGate{refuse: refuse, retryAfter: retryAfter}
	c := brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: "gate-" + randomHex(4)})
	c.Subscribe(agentB.RequestTopic())
	go func() {
		for {
			select {
			case p := <-c.Messages():
				g.answer(c, p)
			case <-c.Done():
				return
			}
		}
	}()
	return g
}

func (g *limitingGate) answer(c *brokertest.Client, p *paho.Publish) {
	var req struct {
		ID     string `json:"id"`
		Params struct {
			Message struct {
				TaskID    string `json:"taskId"`
				ContextID string `json:"contextId"`
			} `json:"message"`
		} `json:"params"`
	}
	_ = json.Unmarshal(p.Payload, &req)
	g.mu.Lock()
	refused := g.refuse != 0
	if g.refuse > 0 {
		g.refuse--
	}
	seen := gateRequest{at: time.Now(), rpcID: req.ID, taskID: req.Params.Message.TaskID, corr: string(p.Properties.CorrelationData), refused: refused}
	g.mu.Unlock()
	var body string
	if refused {
		body = fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"error":{"code":-32070,"message":"too many requests; retry after %.3fs","data":{"a2a_error":"rate_limited","retry_after":%g}}}`,
			req.ID, g.retryAfter, g.retryAfter)
	} else {
		body = fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"result":{"task":{"id":%q,"contextId":%q,"status":{"state":"TASK_STATE_COMPLETED"}}}}`,
			req.ID, req.Params.Message.TaskID, req.Params.Message.ContextID)
	}
	seen.answered = time.Now()
	g.mu.Lock()
	g.requests = append(g.requests, seen)
	g.mu.Unlock()
	// A publish that fails (the test ended) shows as a call without its answer.
	_, _ = c.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: []byte(body),
		Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData, ContentType: "application/json"}})
}

func (g *limitingGate) seen() []gateRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]gateRequest(nil), g.requests...)
}

// TestRateLimitedCallWaitsAndRetries: a call refused -32070 three times is sent again after each
// retry_after, as new attempts of the same call (new Correlation Data, same JSON-RPC id and
// Task.id), and succeeds; the requester counts the three retries. Before the requester honoured
// retry_after the call returned ErrRateLimited at the first refusal.
func TestRateLimitedCallWaitsAndRetries(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		const retryAfter = 0.03
		g := startLimitingGate(t, b, 3, retryAfter)
		req := requesterT(t, b, agentA, nil)
		res, err := req.Transport(agentB).SendMessage(ctxT(t, 10*time.Second), nil, userText("hello"))
		if err != nil {
			t.Fatalf("SendMessage refused three times with retry_after %gs: %v", retryAfter, err)
		}
		if task, ok := res.(*a2a.Task); !ok || task.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("result %#v, want the completed task", res)
		}
		seen := g.seen()
		if len(seen) != 4 {
			t.Fatalf("the gate saw %d requests, want 4 (3 refused, then served)", len(seen))
		}
		corrs := map[string]bool{}
		for i, s := range seen {
			corrs[s.corr] = true
			if s.rpcID != seen[0].rpcID || s.taskID != seen[0].taskID {
				t.Fatalf("attempt %d: id %q task %q, want the first attempt's %q %q", i+1, s.rpcID, s.taskID, seen[0].rpcID, seen[0].taskID)
			}
			if i > 0 {
				if waited := s.at.Sub(seen[i-1].answered); waited < time.Duration(retryAfter*float64(time.Second)) {
					t.Fatalf("attempt %d came %s after the refusal, before its retry_after of %gs", i+1, waited, retryAfter)
				}
			}
		}
		if len(corrs) != 4 {
			t.Fatalf("%d distinct Correlation Data over 4 attempts, want a new one each", len(corrs))
		}
		if got := req.RateLimitRetries(); got != 3 {
			t.Fatalf("RateLimitRetries %d, want 3", got)
		}
		if got := req.RateLimitGiveUps(); got != 0 {
			t.Fatalf("RateLimitGiveUps %d, want 0", got)
		}
	})
}

// TestRateLimitedStreamRetries: the same for a streaming call, whose first reply is the refusal.
func TestRateLimitedStreamRetries(t *testing.T) {
	b := brokertest.StartMochi(t)
	startLimitingGate(t, b, 1, 0.01)
	req := requesterT(t, b, agentA, nil)
	var last a2a.Event
	for ev, err := range req.Transport(agentB).SendStreamingMessage(ctxT(t, 10*time.Second), nil, userText("stream")) {
		if err != nil {
			t.Fatalf("stream refused once: %v", err)
		}
		last = ev
	}
	if task, ok := last.(*a2a.Task); !ok || task.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("last event %#v, want the completed task", last)
	}
	if got := req.RateLimitRetries(); got != 1 {
		t.Fatalf("RateLimitRetries %d, want 1", got)
	}
}

// TestRateLimitedBeyondDeadline: a retry_after that would pass the call's deadline is not waited
// for: the call returns ErrRateLimited at once, with the answer's retry_after.
func TestRateLimitedBeyondDeadline(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		g := startLimitingGate(t, b, -1, 5)
		req := requesterT(t, b, agentA, nil)
		began := time.Now()
		_, err := req.Transport(agentB).SendMessage(ctxT(t, 2*time.Second), nil, userText("hello"))
		if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("err %v, want ErrRateLimited", err)
		}
		if after, ok := RetryAfterOf(err); !ok || after != 5*time.Second {
			t.Fatalf("RetryAfterOf %s %v, want the answer's 5s", after, ok)
		}
		if took := time.Since(began); took >= 2*time.Second {
			t.Fatalf("the call took %s: it waited for its deadline instead of returning", took)
		}
		if n := len(g.seen()); n != 1 {
			t.Fatalf("the gate saw %d requests, want 1", n)
		}
		if req.RateLimitRetries() != 0 || req.RateLimitGiveUps() != 1 {
			t.Fatalf("retries %d, give-ups %d; want 0 and 1", req.RateLimitRetries(), req.RateLimitGiveUps())
		}
	})
}

// TestRateLimitedRetryBudget: a call refused every time is sent RateLimitRetries more times, then
// returns ErrRateLimited; a negative budget returns at the first refusal.
func TestRateLimitedRetryBudget(t *testing.T) {
	b := brokertest.StartMochi(t)
	g := startLimitingGate(t, b, -1, 0.002)
	for _, c := range []struct {
		budget, publishes int
	}{{2, 3}, {-1, 1}} {
		before := len(g.seen())
		caller := AgentRef{Org: agentA.Org, Unit: agentA.Unit, Agent: fmt.Sprintf("budget-%d", c.publishes)}
		req := requesterT(t, b, caller, func(o *RequesterOptions) { o.Retry.RateLimitRetries = c.budget })
		_, err := req.Transport(agentB).SendMessage(ctxT(t, 10*time.Second), nil, userText("hello"))
		if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("budget %d: err %v, want ErrRateLimited", c.budget, err)
		}
		if n := len(g.seen()) - before; n != c.publishes {
			t.Fatalf("budget %d: %d requests published, want %d", c.budget, n, c.publishes)
		}
		if got := req.RateLimitRetries(); got != uint64(c.publishes-1) {
			t.Fatalf("budget %d: RateLimitRetries %d, want %d", c.budget, got, c.publishes-1)
		}
	}
}

// TestRateLimitDelay: a wait is never shorter than retry_after, spreads by at most Jitter×n of it
// (at least a millisecond's worth) on the n-th retry, and without jitter is retry_after exactly.
func TestRateLimitDelay(t *testing.T) {
	p := RetryPolicy{}.withDefaults()
	for _, c := range []struct {
		after time.Duration
		n     int
	}{{5 * time.Millisecond, 1}, {5 * time.Millisecond, 4}, {0, 1}, {time.Second, 2}} {
		spread := max(c.after, time.Millisecond)
		limit := c.after + time.Duration(float64(spread)*p.Jitter*float64(c.n))
		for range 200 {
			if d := p.rateLimitDelay(c.after, c.n); d < c.after || d > limit {
				t.Fatalf("retry_after %s, retry %d: wait %s outside [%s, %s]", c.after, c.n, d, c.after, limit)
			}
		}
	}
	exact := RetryPolicy{Jitter: -1}.withDefaults()
	if d := exact.rateLimitDelay(7*time.Millisecond, 3); d != 7*time.Millisecond {
		t.Fatalf("without jitter: wait %s, want retry_after 7ms", d)
	}
	if got := (RetryPolicy{}).withDefaults(); got.RateLimitRetries != defaultRateLimitRetries || got.RateLimitMaxWait != defaultRateLimitMaxWait {
		t.Fatalf("defaults %d %s", got.RateLimitRetries, got.RateLimitMaxWait)
	}
}
