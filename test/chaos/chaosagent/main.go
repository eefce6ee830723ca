// Command chaosagent is the agent of the chaos suite: an SDK responder (pkg/a2amqtt, a2a-go's
// default handler) that answers "echo:X" with X and "ask:X" with an input-required question whose
// answer Y completes the task with "X+Y". Every execution is appended to a journal file (one
// write per line, so a kill -9 loses nothing already recorded): the suite counts duplicated
// executions from it. Configured like the example agents, by the variables the operator gives a
// workload (A2A_*), plus CHAOS_JOURNAL.
package main

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

type executor struct {
	mu      sync.Mutex
	journal *os.File
}

func (e *executor) record(ec *a2asrv.ExecutorContext, text string) {
	msgID := ""
	if ec.Message != nil {
		msgID = ec.Message.ID
	}
	line := fmt.Sprintf("%s %s %s %q\n", time.Now().UTC().Format(time.RFC3339Nano), ec.TaskID, msgID, text)
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.journal.WriteString(line)
}

func reply(ec *a2asrv.ExecutorContext, text string) *a2a.Message {
	return a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(text))
}

// Execute implements a2asrv.AgentExecutor.
func (e *executor) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		text := a2amqtt.TextOf(ec.Message)
		e.record(ec, text)
		if task := ec.StoredTask; task != nil && task.Status.State == a2a.TaskStateInputRequired && len(task.History) > 0 {
			first := strings.TrimPrefix(a2amqtt.TextOf(task.History[0]), "ask:")
			answer := first + "+" + text
			if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(answer)), nil) {
				return
			}
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, reply(ec, answer)), nil)
			return
		}
		if strings.HasPrefix(text, "ask:") {
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, reply(ec, "and then?")), nil)
			return
		}
		out := strings.TrimPrefix(text, "echo:")
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(out)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, reply(ec, out)), nil)
	}
}

// Cancel implements a2asrv.AgentExecutor.
func (e *executor) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(log); err != nil {
		log.Error("chaos agent stopped", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	ref := a2amqtt.AgentRef{Org: os.Getenv("A2A_ORG"), Unit: os.Getenv("A2A_UNIT"), Agent: os.Getenv("A2A_AGENT")}
	if err := ref.Validate(); err != nil {
		return err
	}
	journal, err := os.OpenFile(os.Getenv("CHAOS_JOURNAL"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer journal.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	broker := os.Getenv("A2A_BROKER")
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{
		BrokerURL: broker, Username: os.Getenv("A2A_USERNAME"), Password: os.Getenv("A2A_PASSWORD"), Agent: ref,
		Card: &a2a.AgentCard{Name: ref.Agent, Description: "chaos suite agent", Version: "0.1.0",
			SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(broker, ref)},
			DefaultInputModes:   []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"}},
		Logger: log,
	})
	if err != nil {
		return err
	}
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: &executor{journal: journal}, RequestTopic: os.Getenv("A2A_REQUEST_TOPIC")})
	if err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	log.Info("chaos agent serving", "agent", ref.String(), "topic", os.Getenv("A2A_REQUEST_TOPIC"))
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = resp.Close(cctx)
	return conn.Close(cctx)
}
