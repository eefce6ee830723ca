package convservice

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	a2alegacy "github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2acompat/a2av0"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// run is what the service remembers of a run it forwarded (a new task or a
// resume) until the run ends, in memory only:
//   - the request as the requester sent it: the message of the run's
//     accepted_history_digest, and what it re-presents to an agent whose
//     first answer shows it takes task ids the other way (taskids.go);
//   - the history window it served the agent about the run's context
//     meanwhile (messages and artifact ids), the digest's other inputs.
//
// A replica that restarts mid-run has lost it: that run's pause is relayed
// without a digest (docs/conversation-service.md).
type run struct {
	in      *inbound
	dialect a2amqtt.Dialect
	// agentIDs: forwarded in core A2A shape (no taskId; the agent creates
	// it). reshaped: already re-forwarded in the other shape once.
	agentIDs, reshaped bool
	// served history messages by history item sequence (oldest first),
	// and served artifact ids.
	served    map[uint64]*a2a.Message
	artifacts map[string]bool
}

type runKey struct{ agent, task string }

// runs tracks the runs in flight.
type runs struct {
	mu sync.Mutex
	m  map[runKey]*run
}

func newRuns() *runs { return &runs{m: map[runKey]*run{}} }

// start records a run forwarded for agent's task (a resume replaces the
// task's previous run).
func (r *runs) start(agent, task string, in *inbound, dialect a2amqtt.Dialect, agentIDs bool) {
	r.mu.Lock()
	r.m[runKey{agent, task}] = &run{in: in, dialect: dialect, agentIDs: agentIDs}
	r.mu.Unlock()
}

func (r *runs) get(agent, task string) *run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[runKey{agent, task}]
}

// end forgets a run (it paused, finished or was undone).
func (r *runs) end(agent, task string) {
	r.mu.Lock()
	delete(r.m, runKey{agent, task})
	r.mu.Unlock()
}

// prune forgets the runs of tasks that are no longer running.
func (r *runs) prune(running func(agent, task string) bool) {
	r.mu.Lock()
	keys := slices.Collect(maps.Keys(r.m))
	r.mu.Unlock()
	for _, k := range keys {
		if !running(k.agent, k.task) {
			r.end(k.agent, k.task)
		}
	}
}

// servedHistory adds what a history answer showed the agent to the runs of
// tasks (the running tasks of the context it asked about).
func (r *runs) servedHistory(agent string, tasks []string, msgs map[uint64]*a2a.Message, artifacts []string) {
	if len(msgs) == 0 && len(artifacts) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, task := range tasks {
		ru := r.m[runKey{agent, task}]
		if ru == nil {
			continue
		}
		if ru.served == nil {
			ru.served, ru.artifacts = map[uint64]*a2a.Message{}, map[string]bool{}
		}
		for seq, m := range msgs {
			ru.served[seq] = m
		}
		for _, id := range artifacts {
			ru.artifacts[id] = true
		}
	}
}

// digest is the run's accepted_history_digest (a2amqtt.HistoryDigest): the
// message the service forwarded, as the requester sent it, the history
// messages it served the agent during the run, oldest first, and the
// artifact ids it served. ok is false when the run is unknown (a restart).
func (r *runs) digest(agent, task string) (digest string, ok bool, err error) {
	r.mu.Lock()
	ru := r.m[runKey{agent, task}]
	var history []*a2a.Message
	var artifacts []string
	if ru != nil {
		seqs := make([]uint64, 0, len(ru.served))
		for seq := range ru.served {
			seqs = append(seqs, seq)
		}
		slices.SortFunc(seqs, cmp.Compare[uint64])
		for _, seq := range seqs {
			history = append(history, ru.served[seq])
		}
		for id := range ru.artifacts {
			artifacts = append(artifacts, id)
		}
	}
	r.mu.Unlock()
	if ru == nil {
		return "", false, nil
	}
	msg, err := requestMessage(ru.in.payload, ru.dialect)
	if err != nil {
		return "", true, err
	}
	d, err := a2amqtt.HistoryDigest(msg, history, artifacts)
	return d, true, err
}

// requestMessage decodes params.message of a send request as an A2A v1.0
// message (v0.3 messages are converted with a2a-go's compatibility layer).
func requestMessage(payload []byte, dialect a2amqtt.Dialect) (*a2a.Message, error) {
	raw, err := rawRequestMessage(payload)
	if err != nil {
		return nil, err
	}
	return decodeMessage(raw, dialect == a2amqtt.DialectV03)
}

// rawRequestMessage returns params.message of a request as sent.
func rawRequestMessage(payload []byte) (json.RawMessage, error) {
	var env struct {
		Params struct {
			Message json.RawMessage `json:"message"`
		} `json:"params"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return nil, fmt.Errorf("request message: %w", err)
	}
	if len(env.Params.Message) == 0 {
		return nil, fmt.Errorf("request has no params.message")
	}
	return env.Params.Message, nil
}

// decodeMessage decodes an A2A message in v1.0 or v0.3 JSON.
func decodeMessage(raw []byte, v03 bool) (*a2a.Message, error) {
	if !v03 {
		var m a2a.Message
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("message: %w", err)
		}
		return &m, nil
	}
	var old a2alegacy.Message
	if err := json.Unmarshal(raw, &old); err != nil {
		return nil, fmt.Errorf("A2A v0.3 message: %w", err)
	}
	m, err := a2av0.ToV1Message(&old)
	if err != nil {
		return nil, fmt.Errorf("A2A v0.3 message: %w", err)
	}
	return m, nil
}
