package gateway

import (
	"context"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// planner is an HTTP agent written for a2a-go's stock server, as any A2A v1.0 agent is: the server
// creates task and context ids, a new task opens with its Task, then asks for approval
// (input-required); "go ahead" completes it. Each new task says how many tasks its context has
// had, so a follow-up shows that it reached the same context on the HTTP agent.
type planner struct {
	mu       sync.Mutex
	turns    map[string]int
	canceled []a2a.TaskID // the planner's own task ids
	srv      *httptest.Server
}

func (p *planner) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		text := a2amqtt.TextOf(ec.Message)
		stored := ec.StoredTask
		if stored == nil {
			p.mu.Lock()
			p.turns[ec.ContextID]++
			n := p.turns[ec.ContextID]
			p.mu.Unlock()
			if !yield(a2a.NewSubmittedTask(ec, ec.Message), nil) {
				return
			}
			ask := a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(fmt.Sprintf("Turn %d. Plan: %s. Say 'go ahead'.", n, text)))
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, ask), nil)
			return
		}
		if !strings.Contains(strings.ToLower(text), "go ahead") {
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("Please confirm."))), nil)
			return
		}
		plan := a2amqtt.TextOf(stored.History[0])
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart("done: "+plan)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("Done: "+plan))), nil)
	}
}

func (p *planner) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		p.mu.Lock()
		p.canceled = append(p.canceled, ec.TaskID)
		p.mu.Unlock()
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

// plannerCard is the card the planner serves: it differs from the test fleet's manifest for
// httpagent in its description and its skill.
var plannerCard = &a2a.AgentCard{Name: "httpagent", Description: "plans deployments, then waits for a yes", Version: "1.0.0",
	Capabilities:      a2a.AgentCapabilities{Streaming: true},
	DefaultInputModes: []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"},
	Skills: []a2a.AgentSkill{{ID: "plan", Name: "Plan", Description: "plans a deployment", Tags: []string{"deploy"}}}}

// startPlanner serves a planner with a2a-go's own handler and JSON-RPC server on loopback.
func startPlanner(t testing.TB) (*planner, string) {
	t.Helper()
	p := &planner{turns: map[string]int{}}
	mux := http.NewServeMux()
	mux.Handle("/", a2asrv.NewJSONRPCHandler(a2asrv.NewHandler(p)))
	mux.Handle("GET /.well-known/agent-card.json", a2asrv.NewStaticAgentCardHandler(plannerCard))
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p, p.srv.URL + "/"
}

// startHTTPAgent is startPlanner for tests that only need its URL.
func startHTTPAgent(t testing.TB) string {
	t.Helper()
	_, url := startPlanner(t)
	return url
}

// startMQTTAgent runs the example memory agent with the SDK's Responder as fleet agent name,
// on its delivery topic when governed.
func (st *stack) startMQTTAgent(t testing.TB, ctx context.Context, name string, governed bool, delay ...time.Duration) {
	t.Helper()
	id := ref(name)
	topic := ""
	if governed {
		topic = identity.DeliveryTopic(id)
	}
	a, err := agents.Start(ctx, agents.KindMemory, agents.Options{
		BrokerURL: st.brokerURL, Username: st.usernames[name], Password: st.passwords[name], Agent: id, RequestTopic: topic,
		Delay: sum(delay),
	})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// httpClient is a2a-go's HTTP client for an agent behind the gateway: the card from the
// well-known path, then the JSON-RPC interface the card names, with the token on both.
func httpClient(t testing.TB, ctx context.Context, gatewayURL, agent, token string) (*a2aclient.Client, *a2a.AgentCard) {
	t.Helper()
	hc := &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}, Timeout: time.Minute}
	card, err := agentcard.NewResolver(hc).Resolve(ctx, fmt.Sprintf("%s/agents/%s/%s/%s", gatewayURL, org, unit, agent))
	if err != nil {
		t.Fatalf("resolve card of %s: %v", agent, err)
	}
	c, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(hc))
	if err != nil {
		t.Fatalf("client for %s: %v", agent, err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	return c, card
}

func sum(ds []time.Duration) time.Duration {
	var total time.Duration
	for _, d := range ds {
		total += d
	}
	return total
}
