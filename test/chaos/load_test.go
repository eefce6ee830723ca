package chaos

import (
	"context"
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

	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// sendOnce sends text to agent as one message (its id returned through msgID).
func sendOnce(ctx context.Context, r *a2amqtt.Requester, agent, taskID, contextID, text string) (a2a.SendMessageResult, error) {
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	msg.TaskID, msg.ContextID = a2a.TaskID(taskID), contextID
	return r.Transport(ref(agent)).SendMessage(ctx, nil, &a2a.SendMessageRequest{Message: msg})
}

func stateOf(res a2a.SendMessageResult) a2a.TaskState {
	switch v := res.(type) {
	case *a2a.Task:
		return v.Status.State
	case *a2a.Message:
		return a2a.TaskStateCompleted
	}
	return a2a.TaskStateUnspecified
}

// Outcomes of a request, from the requester's side.
const (
	completed  = "completed"  // the right answer
	errored    = "errored"    // a clear error (JSON-RPC error, refused publish, no subscriber)
	lost       = "lost"       // no answer at all after the SDK's retries (ErrNoReply)
	frozen     = "frozen"     // the call did not return by itself within callDeadline
	mismatched = "mismatched" // an answer, but not the one for this request
)

// callDeadline bounds one call: the SDK gives up after 3 attempts of 15 s plus back-off (~52 s);
// a call still running after this is a frozen client.
const callDeadline = 2 * time.Minute

type record struct {
	agent      string
	start, end time.Time
	outcome    string
	err        string
	ids        string // of a request that broke the bar (identify)
}

// ledger records every request of a load.
type ledger struct {
	mu      sync.Mutex
	records []record
	msgIDs  map[string]bool
}

func (l *ledger) add(r record, msgIDs ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	for _, id := range msgIDs {
		l.msgIDs[id] = true
	}
}

// load runs workers that send requests until stopped: the even ones echo requests to the direct
// agent, the odd ones alternately echo requests and two-turn conversations (input-required, then
// the answer in the same task) to the gated agent. A worker serves one agent, so that a fault of
// one path (the service) does not stall the requests of the other.
type load struct {
	f      *fleet
	ledger *ledger
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// work is how long the agent works on each echo request (0: answers at once).
	work time.Duration
}

func (f *fleet) startLoad(workers int) *load { return f.startLoadWith(workers, 0) }

// startLoadWith is startLoad with echo requests that keep the agent busy for work each, so that
// some are always executing when a fault strikes.
func (f *fleet) startLoadWith(workers int, work time.Duration) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{f: f, ledger: &ledger{msgIDs: map[string]bool{}}, cancel: cancel, work: work}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				switch {
				case w%2 == 0:
					l.echo(ctx, "direct")
				case i%2 == 1:
					l.conversation(ctx)
				default:
					l.echo(ctx, "gated")
				}
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	return l
}

func classify(err error) string {
	switch {
	case err == nil:
		return completed
	case errors.Is(err, context.DeadlineExceeded):
		return frozen
	case errors.Is(err, a2amqtt.ErrNoReply):
		return lost
	}
	return errored
}

// call runs one send with its own deadline, independent of the load's stop (a request in flight
// when the load stops still gets its outcome).
func (l *load) call(agent, taskID, contextID, text string) (a2a.SendMessageResult, *a2a.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
	defer cancel()
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	msg.TaskID, msg.ContextID = a2a.TaskID(taskID), contextID
	res, err := l.f.requester.Transport(ref(agent)).SendMessage(ctx, nil, &a2a.SendMessageRequest{Message: msg})
	return res, msg, err
}

func (l *load) echo(ctx context.Context, agent string) {
	want := uuid.NewString()
	text := "echo:" + want
	if l.work > 0 {
		text = fmt.Sprintf("work:%s:%s", l.work, want)
	}
	start, task := time.Now(), uuid.NewString()
	res, msg, err := l.call(agent, task, uuid.NewString(), text)
	r := record{agent: agent, start: start, end: time.Now(), outcome: classify(err)}
	if err != nil {
		r.err = err.Error()
	} else if got := a2amqtt.ResultText(res); got != want {
		r.outcome, r.err = mismatched, fmt.Sprintf("want %q, got %q", want, got)
	}
	r.identify(task, msg.ID)
	l.ledger.add(r, msg.ID)
}

// identify adds the ids and start of a request that broke the bar to its error, so that it can
// be found in the logs of the service and the agents.
func (r *record) identify(task, msgID string) {
	if r.outcome == lost || r.outcome == frozen || r.outcome == mismatched {
		r.ids = fmt.Sprintf(" [task %s, message %s, started %s]", task, msgID, r.start.UTC().Format("15:04:05.000"))
	}
}

func (l *load) conversation(ctx context.Context) {
	task, contextID, first, second := uuid.NewString(), uuid.NewString(), uuid.NewString()[:8], uuid.NewString()[:8]
	start := time.Now()
	res, m1, err := l.call("gated", task, contextID, "ask:"+first)
	r := record{agent: "gated-2turn", start: start, outcome: classify(err)}
	switch {
	case err != nil:
		r.err = "turn 1: " + err.Error()
	case stateOf(res) != a2a.TaskStateInputRequired:
		r.outcome, r.err = mismatched, fmt.Sprintf("turn 1: state %s", stateOf(res))
	default:
		var m2 *a2a.Message
		res, m2, err = l.call("gated", task, contextID, second)
		r.outcome = classify(err)
		switch {
		case err != nil:
			r.err = "turn 2: " + err.Error()
		case a2amqtt.ResultText(res) != first+"+"+second:
			r.outcome, r.err = mismatched, fmt.Sprintf("turn 2: want %q, got %q", first+"+"+second, a2amqtt.ResultText(res))
		}
		r.end = time.Now()
		r.identify(task, m1.ID+", "+m2.ID)
		l.ledger.add(r, m1.ID, m2.ID)
		return
	}
	r.end = time.Now()
	r.identify(task, m1.ID)
	l.ledger.add(r, m1.ID)
}

// report is what a scenario measured.
type report struct {
	name                                                               string
	requests, completed, errored, lost, duplicated, frozen, mismatched int
	errors                                                             map[string]int
	// outage is, per agent, the longest stretch of the run without a completed request: how long
	// its clients went without an answer.
	outage   map[string]time.Duration
	duration time.Duration
	loadavg  string
}

// stop ends the load, waits for the requests in flight and counts, with the agents' journals (on
// their workloads' volumes, so the executions of pods a rollout deleted count too), the
// executions of each request (more than one is a duplicate), and per agent the longest stretch
// without a completed request (its outage as its clients saw it).
func (l *load) stop(ctx context.Context, name string, started time.Time) report {
	l.cancel()
	l.wg.Wait()
	rep := report{name: name, errors: map[string]int{}, outage: map[string]time.Duration{}, duration: time.Since(started), loadavg: hostload.Average()}
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	completions := map[string][]time.Time{}
	for _, r := range l.ledger.records {
		rep.requests++
		switch r.outcome {
		case completed:
			rep.completed++
			completions[r.agent] = append(completions[r.agent], r.end)
		case errored:
			rep.errored++
		case lost:
			rep.lost++
		case frozen:
			rep.frozen++
		case mismatched:
			rep.mismatched++
		}
		if r.err != "" {
			rep.errors[r.outcome+": "+shorten(r.err)+r.ids]++
		}
	}
	for agent, ends := range completions {
		slices.SortFunc(ends, time.Time.Compare)
		prev := started
		for _, end := range ends {
			rep.outage[agent] = max(rep.outage[agent], end.Sub(prev))
			prev = end
		}
	}
	for id, runs := range l.f.journals(ctx) {
		if l.ledger.msgIDs[id] && len(runs) > 1 {
			rep.duplicated += len(runs) - 1
			rep.errors[fmt.Sprintf("duplicated: message %s executed %d times: %s", id, len(runs), strings.Join(runs, "; "))]++
		}
	}
	return rep
}

func shorten(s string) string {
	if len(s) > 160 {
		s = s[:160]
	}
	return s
}

// check logs the report as one evidence line and fails the test unless nothing was lost,
// duplicated, mismatched or frozen.
func (rep report) check(t *testing.T) {
	t.Helper()
	var rec []string
	for _, k := range []string{"direct", "gated", "gated-2turn"} {
		if d, ok := rep.outage[k]; ok {
			rec = append(rec, fmt.Sprintf("%s %.1fs", k, d.Seconds()))
		}
	}
	fmt.Printf("chaos result: %s: %d requests in %s: %d completed, %d errored, %d lost, %d duplicated, %d mismatched, %d frozen; longest stretch without a completed request: %s; load average %s\n",
		rep.name, rep.requests, rep.duration.Round(time.Second), rep.completed, rep.errored, rep.lost, rep.duplicated, rep.mismatched, rep.frozen, strings.Join(rec, ", "), rep.loadavg)
	var kinds []string
	for k := range rep.errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		t.Logf("  %5d × %s", rep.errors[k], k)
	}
	if rep.requests == 0 || rep.completed == 0 {
		t.Errorf("%s: the load completed nothing (%d requests): the scenario proves nothing", rep.name, rep.requests)
	}
	if rep.lost+rep.duplicated+rep.mismatched+rep.frozen > 0 {
		t.Errorf("%s: %d lost, %d duplicated, %d mismatched, %d frozen (the bar is 0)", rep.name, rep.lost, rep.duplicated, rep.mismatched, rep.frozen)
	}
}
