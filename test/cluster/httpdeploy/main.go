// Command httpdeploy is an HTTP A2A agent written only with a2a-go (its stock request handler,
// JSON-RPC server and card handler; nothing of this project), which the kind suite runs in a pod
// and joins to the fleet as an Agent whose spec.http.url names it. It behaves like the JS SDK's
// test/gateway/js/http-responder.mjs: a new task asks "Turn N. Deploy X? Answer yes or no."
// (input-required; N counts the tasks of its context, so a follow-up shows that it reached the
// same context); "yes" resumes it (working, an artifact, completed), "no" cancels it, anything
// else asks again.
//
//	httpdeploy --addr :8082 --url http://http-agents.default.svc:8082/
package main

import (
	"context"
	"flag"
	"fmt"
	"iter"
	"log"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
)

// deployer is the executor; turns counts the tasks of each context.
type deployer struct {
	mu    sync.Mutex
	turns map[string]int
}

func textOf(m *a2a.Message) string {
	if m == nil {
		return ""
	}
	var texts []string
	for _, p := range m.Parts {
		if t, ok := p.Content.(a2a.Text); ok {
			texts = append(texts, string(t))
		}
	}
	return strings.Join(texts, "\n")
}

func say(ec *a2asrv.ExecutorContext, text string) *a2a.Message {
	return a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(text))
}

func (d *deployer) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		said := strings.TrimSpace(textOf(ec.Message))
		if ec.StoredTask == nil {
			d.mu.Lock()
			d.turns[ec.ContextID]++
			n := d.turns[ec.ContextID]
			d.mu.Unlock()
			if !yield(a2a.NewSubmittedTask(ec, ec.Message), nil) {
				return
			}
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, say(ec, fmt.Sprintf("Turn %d. Deploy %s? Answer yes or no.", n, said))), nil)
			return
		}
		plan := "it"
		if len(ec.StoredTask.History) > 0 {
			plan = strings.TrimSpace(textOf(ec.StoredTask.History[0]))
		}
		switch strings.ToLower(said) {
		case "yes":
			if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, say(ec, "deploying "+plan)), nil) {
				return
			}
			if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart("deployed "+plan)), nil) {
				return
			}
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, say(ec, "Deployed "+plan+".")), nil)
		case "no":
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, say(ec, "Not deploying "+plan+".")), nil)
		default:
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, say(ec, "Please answer yes or no.")), nil)
		}
	}
}

func (d *deployer) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	url := flag.String("url", "", "the URL the card names (default http://ADDR/)")
	flag.Parse()
	if *url == "" {
		*url = "http://" + *addr + "/"
	}
	card := &a2a.AgentCard{
		Name: "deploy", Description: "deploys after a yes (a2a-go over HTTP)", Version: "1.0.0",
		SupportedInterfaces: []*a2a.AgentInterface{a2a.NewAgentInterface(*url, a2a.TransportProtocolJSONRPC)},
		Capabilities:        a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:   []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"},
	}
	mux := http.NewServeMux()
	mux.Handle("/", a2asrv.NewJSONRPCHandler(a2asrv.NewHandler(&deployer{turns: map[string]int{}})))
	mux.Handle("GET /.well-known/agent-card.json", a2asrv.NewStaticAgentCardHandler(card))
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("httpdeploy: serving %s on %s", *url, *addr)
	log.Fatal(srv.ListenAndServe())
}
