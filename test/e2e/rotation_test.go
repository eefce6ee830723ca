package e2e

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestRotationUnderLoad, on both brokers: the credentials of two agents without a workload, one
// reached directly and one behind the conversation service, are rotated three times while four
// requesters keep sending. The agents are SDK responders that read their credentials folder at every
// CONNECT (a2amqtt.CredentialsDir) and keep a persistent session (a2amqtt.DefaultAgentSessionExpiry:
// the broker keeps a request it was sending when the password change kicked the agent, where a clean
// session dropped it, 1 in about 2 000 under load, and the responder drops the copy the broker
// resends of one it had taken); the folder follows the Secret as a Secret volume or make dev's
// projection does (here: polled every 50 ms). The bar: nothing lost (no ErrNoReply), nothing executed
// twice, no answer to the wrong request, and the errors a rotation causes (the agent is
// disconnected by the password change and back at its next CONNECT) stay within a few seconds per
// rotation. Before, the agents were given the password once: the broker refused them for good, and
// every request got -32004 from then on (issue 23: 811 requests over 68 s and more).
func TestRotationUnderLoad(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind)
		st.startService(t, ctx, &clock{}, "r1")
		exec := &countingExec{runs: map[string]int{}}
		for _, name := range []string{"direct", "memory"} {
			dir := t.TempDir()
			keepCredentials(t, ctx, st.ns, name, dir)
			topic := ""
			if name == "memory" {
				topic = identity.DeliveryTopic(ref(name))
			}
			conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Agent: ref(name), Credentials: a2amqtt.CredentialsDir(dir),
				SessionExpiry: a2amqtt.DefaultAgentSessionExpiry, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			if _, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: exec, RequestTopic: topic}); err != nil {
				t.Fatal(err)
			}
		}
		r := st.requester(t, ctx)
		load := startLoad(ctx, r, []a2amqtt.AgentRef{ref("direct"), ref("memory")}, 4)

		time.Sleep(2 * time.Second)
		var rotations []time.Time
		for round := 1; round <= 3; round++ {
			at := time.Now()
			rotations = append(rotations, at)
			for _, name := range []string{"direct", "memory"} {
				rotate(t, ctx, st.ns, name, fmt.Sprintf("round-%d", round))
			}
			for _, name := range []string{"direct", "memory"} {
				eventually(t, time.Minute, name+" rotated", func() error {
					s := &corev1.Secret{}
					if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: name + "-mqtt-credentials"}, s); err != nil {
						return err
					}
					if s.Annotations["a2a.fleet.dev/rotated-for"] != fmt.Sprintf("round-%d", round) {
						return fmt.Errorf("not yet")
					}
					return nil
				})
			}
			time.Sleep(4 * time.Second) // traffic after the rotation
		}
		rep := load.stop()
		windows := rep.errorWindows(rotations, 500*time.Millisecond)
		t.Logf("%s: rotation ×3 of both agents under load: %s; error windows per rotation %v", kind, rep, windows)
		if rep.lost > 0 || rep.mismatched > 0 {
			t.Errorf("lost %d, mismatched %d: want 0; lost: %v", rep.lost, rep.mismatched, rep.lostDetails(exec, rotations))
		}
		if d := exec.duplicates(); d > 0 {
			t.Errorf("%d requests executed more than once", d)
		}
		if rep.completed == 0 {
			t.Fatal("nothing completed: the test shows nothing")
		}
		for i, w := range windows {
			if w > 5*time.Second {
				t.Errorf("rotation %d: errors for %s (want at most a few seconds)", i+1, w)
			}
		}
	})
}

// rotate asks for new credentials for an Agent.
func rotate(t *testing.T, ctx context.Context, ns, name, value string) {
	t.Helper()
	a := &a2av1.Agent{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(a.DeepCopy())
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	a.Annotations["a2a.fleet.dev/rotate-credentials"] = value
	if err := k8s.Patch(ctx, a, patch); err != nil {
		t.Fatal(err)
	}
}

// keepCredentials keeps the Agent's credentials Secret in dir (polled every 50 ms), as a Secret
// volume or make dev's projection does.
func keepCredentials(t *testing.T, ctx context.Context, ns, name, dir string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	last := ""
	sync := func() error {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-mqtt-credentials"}, s); err != nil {
			return err
		}
		if p := string(s.Data["password"]); p != last {
			if err := a2amqtt.WriteCredentialsDir(dir, s.Data); err != nil {
				return err
			}
			last = p
		}
		return nil
	}
	if err := sync(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = sync()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// countingExec echoes and counts executions per task (a retry of a finished task must be answered
// from the task store, not executed again).
type countingExec struct {
	mu   sync.Mutex
	runs map[string]int
}

func (e *countingExec) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	e.mu.Lock()
	e.runs[string(ec.TaskID)]++
	e.mu.Unlock()
	return func(yield func(a2a.Event, error) bool) {
		text := a2amqtt.TextOf(ec.Message)
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("echo: "+text))), nil)
	}
}

func (e *countingExec) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func (e *countingExec) duplicates() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.runs {
		if c > 1 {
			n++
		}
	}
	return n
}

// load keeps workers sending single-turn requests to the targets in turn, through st.requester:
// one attempt, 10 s for the reply, no retry, so a request lost anywhere (at the broker, in a
// client's session, in a draining responder) shows as lost instead of being saved by a retry.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    []outcome
}

type outcome struct {
	target  string
	taskID  string
	at      time.Time
	kind    string // completed, errored, lost, mismatched
	detail  string
	elapsed time.Duration
}

func startLoad(ctx context.Context, r *a2amqtt.Requester, targets []a2amqtt.AgentRef, workers int) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel}
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				tr := r.Transport(targets[i%len(targets)])
				text := fmt.Sprintf("req-%d-%d", w, i)
				taskID := uuid.NewString()
				start := time.Now()
				res, err := send(ctx, tr, taskID, uuid.NewString(), text)
				if ctx.Err() != nil {
					return
				}
				o := outcome{target: targets[i%len(targets)].String(), taskID: taskID, at: start, elapsed: time.Since(start)}
				switch {
				case errors.Is(err, a2amqtt.ErrNoReply):
					o.kind, o.detail = "lost", err.Error()
				case err != nil:
					o.kind, o.detail = "errored", err.Error()
				case a2amqtt.ResultText(res) != "echo: "+text:
					o.kind, o.detail = "mismatched", a2amqtt.ResultText(res)
				default:
					o.kind = "completed"
				}
				l.mu.Lock()
				l.out = append(l.out, o)
				l.mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return l
}

type loadReport struct {
	completed, errored, lost, mismatched int
	errors                               map[string]int
	out                                  []outcome
}

func (l *load) stop() loadReport {
	l.cancel()
	l.wg.Wait()
	rep := loadReport{errors: map[string]int{}, out: l.out}
	for _, o := range l.out {
		switch o.kind {
		case "completed":
			rep.completed++
		case "errored":
			rep.errored++
			msg := o.detail
			if i := strings.Index(msg, ": "); i > 0 && len(msg) > 90 {
				msg = msg[:90]
			}
			rep.errors[msg]++
		case "lost":
			rep.lost++
		case "mismatched":
			rep.mismatched++
		}
	}
	return rep
}

func (r loadReport) String() string {
	var errs []string
	for m, n := range r.errors {
		errs = append(errs, fmt.Sprintf("%d× %q", n, m))
	}
	sort.Strings(errs)
	return fmt.Sprintf("%d requests: %d completed, %d errored, %d lost, %d mismatched (errors: %s)",
		len(r.out), r.completed, r.errored, r.lost, r.mismatched, strings.Join(errs, "; "))
}

// errorWindows is, for each rotation, the longest run of failed requests to one target that
// began after it (and before the next one): from the start of the run's first failure to the end
// of its last, a run ending at the target's next completed request. A run still going when the
// load stopped ends there.
func (r loadReport) errorWindows(rotations []time.Time, slack time.Duration) []time.Duration {
	byTarget := map[string][]outcome{}
	for _, o := range r.out {
		byTarget[o.target] = append(byTarget[o.target], o)
	}
	out := make([]time.Duration, len(rotations))
	for _, os := range byTarget {
		sort.Slice(os, func(i, j int) bool { return os[i].at.Before(os[j].at) })
		for i := 0; i < len(os); i++ {
			if os[i].kind == "completed" {
				continue
			}
			first, last := os[i].at, os[i].at.Add(os[i].elapsed)
			for i+1 < len(os) && os[i+1].kind != "completed" {
				i++
				if e := os[i].at.Add(os[i].elapsed); e.After(last) {
					last = e
				}
			}
			for k, at := range rotations {
				if first.Before(at.Add(-slack)) || (k+1 < len(rotations) && !first.Before(rotations[k+1].Add(-slack))) {
					continue
				}
				out[k] = max(out[k], last.Sub(first).Round(10*time.Millisecond))
			}
		}
	}
	return out
}

// lostDetails says, for each request the load lost, where it was lost: never executed (the
// request did not reach the agent's executor) or executed n times (its answer did not come back),
// and when it was sent relative to the rotation before it.
func (r loadReport) lostDetails(exec *countingExec, rotations []time.Time) []string {
	var out []string
	for _, o := range r.out {
		if o.kind != "lost" {
			continue
		}
		exec.mu.Lock()
		runs := exec.runs[o.taskID]
		exec.mu.Unlock()
		since := "before the first rotation"
		for k := len(rotations) - 1; k >= 0; k-- {
			if !o.at.Before(rotations[k]) {
				since = fmt.Sprintf("rotation %d +%s", k+1, o.at.Sub(rotations[k]).Round(time.Millisecond))
				break
			}
		}
		out = append(out, fmt.Sprintf("%s task %s sent at %s, executed %d×", o.target, o.taskID, since, runs))
	}
	return out
}
