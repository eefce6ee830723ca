package convservice

// Expiry on time and the statistics (sweeper).

import (
	"context"
	"fmt"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func (s *sweeper) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.lastSweep.Store(time.Now().UnixNano())
		swept, t := s.mem.Sweep(s.agents.policyOf, s.cfg.Now())
		if err := t.Wait(ctx); err != nil {
			if ctx.Err() == nil {
				s.log.Error(err, "journal expiry sweep")
			}
			continue
		}
		for _, x := range swept {
			s.expired(ctx, x.Agent, x.Expiration)
		}
		if time.Since(lastPrune) > runPruneInterval {
			// Runs end with their task's pause or end; this catches the
			// rest (a task evicted or expired while running).
			lastPrune = time.Now()
			s.runs.prune(func(agent, task string) bool {
				_, t := s.mem.Task(agent, task)
				return t != nil && runningState(t.State)
			})
		}
	}
}

// runPruneInterval is how often runs of tasks that stopped running are
// forgotten.
const runPruneInterval = 30 * time.Second

// expired acts on what expiry did: tasks failed by the input-required
// timeout and unfinished tasks of an expired context are canceled at the
// agent, which still believes they wait or run.
func (s *sweeper) expired(ctx context.Context, agent string, x conversation.Expiration) {
	for _, t := range x.TimedOut {
		s.runs.end(agent, t.TaskID)
		s.log.Info("input-required timeout: task failed", "agent", agent, "context", x.ContextID, "task", t.TaskID, "waiting_since", t.WaitingSince)
		s.fwd.cancelAtAgent(ctx, agent, x.ContextID, t.TaskID)
		if t.Notify != nil {
			// The requester's stream ended at input-required; tell it there
			// anyway (a client still listening learns at once, others drop
			// an unknown correlation; the next resume gets -32004 with the
			// same status message).
			s.out.notifyFailed(ctx, *t.Notify, x.ContextID, t.TaskID, t.StatusMessage)
		}
	}
	for _, u := range x.Unacknowledged {
		s.runs.end(agent, u.TaskID)
		s.log.Info("first-event timeout: no agent acknowledged the request, run undone", "agent", agent,
			"context", x.ContextID, "task", u.TaskID, "forwarded_at", u.Since)
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorResponderUnavailable).Inc()
		for _, st := range u.Streams {
			s.out.answer(ctx, st.ResponseTopic, st.Correlation, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
				fmt.Sprintf("agent %s did not acknowledge task %s within %s of it being forwarded (no agent is reading its requests); the task was not started, retry later",
					agent, u.TaskID, s.agents.policyOf(agent).FirstEventTimeout)))
		}
	}
	if x.Expired != nil {
		s.log.Info("context expired", "agent", agent, "context", x.ContextID, "reason", x.Expired.Reason)
		for _, t := range x.Dropped {
			s.runs.end(agent, t.ID)
			if !t.Terminal() {
				s.fwd.cancelAtAgent(ctx, agent, x.ContextID, t.ID)
			}
		}
	}
}

func (s *sweeper) statsLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		s.refreshStats(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshStats sets the gauges from the counters the in-memory state keeps
// (no scan of the store).
func (s *sweeper) refreshStats(context.Context) {
	live, states := s.mem.Stats()
	s.m.activeContexts.Reset()
	for a, n := range live {
		s.m.activeContexts.WithLabelValues(a).Set(float64(n))
	}
	s.m.tasks.Reset()
	for st, n := range states {
		if n > 0 {
			s.m.tasks.WithLabelValues(string(st)).Set(float64(n))
		}
	}
	items, bytes := s.mem.HistoryStats()
	s.m.historyItems.Set(float64(items))
	s.m.historyBytes.Set(float64(bytes))
}
