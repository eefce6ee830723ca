package conversation

import (
	"fmt"
	"time"

	"github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// Defaults applied when a ConversationPolicySpec leaves a field unset. They
// mirror the CRD's kubebuilder defaults so a policy built in Go (tests, the
// embedded default) behaves like one that went through the API server.
const (
	DefaultIdleTTL                = 30 * time.Minute
	DefaultHistoryTasksPerContext = 20
	// DefaultTombstoneTTL is how long an expired context is remembered so a
	// late follow-up gets "context expired" instead of silently starting a
	// new conversation under the old id.
	DefaultTombstoneTTL = 24 * time.Hour
	// DefaultFirstEventTimeout mirrors the CRD default of
	// spec.firstEventTimeout.
	DefaultFirstEventTimeout = 30 * time.Second
	// DefaultMaxStreamsPerTask bounds the reply streams (correlations)
	// tracked per task; retries with fresh correlation data add streams.
	DefaultMaxStreamsPerTask = 8
)

// Policy is the engine's view of a ConversationPolicy. Zero values mean "no
// limit" for the limits and "never" for the durations, except
// HistoryTasksPerContext, TombstoneTTL and MaxStreamsPerTask, where zero
// selects the default (a context without history would break mismatch
// detection for its own finished tasks).
type Policy struct {
	// IdleTTL expires a context this long after its last activity (any
	// request accepted for it or any reply event of its tasks). 0 = never.
	IdleTTL time.Duration
	// MaxAge expires a context this long after it was created, however
	// active. 0 = never.
	MaxAge time.Duration
	// InputRequiredTimeout fails a task waiting in input-required or
	// auth-required longer than this. 0 = wait forever (until the context
	// expires).
	InputRequiredTimeout time.Duration
	// FirstEventTimeout undoes a run (new task or resume) that got no event
	// from the agent this long after it was forwarded: no agent took it, so
	// it must not hold a context's slot. 0 = never.
	FirstEventTimeout time.Duration
	// MaxConcurrentTasksPerContext caps the tasks of one context that are
	// submitted or working at once. 0 = unlimited; 1 = the concurrent-call
	// guard.
	MaxConcurrentTasksPerContext int
	// MaxActiveContextsPerAgent caps the unexpired contexts of one agent.
	// 0 = unlimited.
	MaxActiveContextsPerAgent int
	// MaxActiveContextsPerCaller caps the unexpired contexts one caller
	// (Request.Requester) opened at one agent. 0 = the fair share of
	// MaxActiveContextsPerAgent (CallerShare); with no agent limit either,
	// unlimited.
	MaxActiveContextsPerCaller int
	// HistoryTasksPerContext is how many tasks a context keeps; the oldest
	// finished tasks are evicted first, unfinished tasks never are.
	HistoryTasksPerContext int
	// TombstoneTTL is how long an expired context is kept (without tasks) to
	// answer "context expired". Not part of the CRD; the service may tune it.
	TombstoneTTL time.Duration
	// MaxStreamsPerTask bounds tracked reply streams per task.
	MaxStreamsPerTask int
	// History is what the service keeps of a context for history queries
	// (v1alpha1.HistoryNone, HistorySummaries, HistoryMessages; "" means
	// Summaries). The rules never depend on it.
	History v1alpha1.HistoryMode
	// MaxHistoryBytes bounds the message and artifact content kept per
	// context in Messages mode; the oldest content goes first.
	MaxHistoryBytes int
}

// DefaultMaxHistoryBytes mirrors the CRD default of
// spec.history.maxBytesPerContext.
const DefaultMaxHistoryBytes = 64 << 10

// KeepsMessages reports whether the service keeps message and artifact
// content (history mode Messages).
func (p Policy) KeepsMessages() bool { return p.History == v1alpha1.HistoryMessages }

// HistoryBytes is the content bound per context in Messages mode.
func (p Policy) HistoryBytes() int {
	if p.MaxHistoryBytes <= 0 {
		return DefaultMaxHistoryBytes
	}
	return p.MaxHistoryBytes
}

// DefaultPolicy is the policy of a ConversationPolicy with an empty spec.
func DefaultPolicy() Policy {
	return Policy{
		IdleTTL:                DefaultIdleTTL,
		FirstEventTimeout:      DefaultFirstEventTimeout,
		HistoryTasksPerContext: DefaultHistoryTasksPerContext,
		TombstoneTTL:           DefaultTombstoneTTL,
		MaxStreamsPerTask:      DefaultMaxStreamsPerTask,
		History:                v1alpha1.HistorySummaries,
		MaxHistoryBytes:        DefaultMaxHistoryBytes,
	}
}

// NewPolicy converts a ConversationPolicySpec. Unset fields take the CRD
// defaults. It returns an error for values the CRD's validation would have
// refused (negative limits or durations), so a policy that bypassed
// admission cannot turn a limit into nonsense.
func NewPolicy(spec *v1alpha1.ConversationPolicySpec) (Policy, error) {
	p := DefaultPolicy()
	if spec == nil {
		return p, nil
	}
	if spec.ContextIdleTTL != nil {
		p.IdleTTL = spec.ContextIdleTTL.Duration
	}
	if spec.ContextMaxAge != nil {
		p.MaxAge = spec.ContextMaxAge.Duration
	}
	if spec.InputRequiredTimeout != nil {
		p.InputRequiredTimeout = spec.InputRequiredTimeout.Duration
	}
	if spec.FirstEventTimeout != nil {
		p.FirstEventTimeout = spec.FirstEventTimeout.Duration
	}
	p.MaxConcurrentTasksPerContext = int(spec.MaxConcurrentTasksPerContext)
	p.MaxActiveContextsPerAgent = int(spec.MaxActiveContextsPerAgent)
	p.MaxActiveContextsPerCaller = int(spec.MaxActiveContextsPerCaller)
	if spec.HistoryTasksPerContext != 0 {
		p.HistoryTasksPerContext = int(spec.HistoryTasksPerContext)
	}
	if h := spec.History; h != nil {
		if h.Mode != "" {
			p.History = h.Mode
		}
		if h.MaxBytesPerContext != 0 {
			p.MaxHistoryBytes = int(h.MaxBytesPerContext)
		}
	}
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("conversation policy spec: %w", err)
	}
	return p, nil
}

// Validate reports values no policy may have.
func (p Policy) Validate() error {
	switch {
	case p.IdleTTL < 0:
		return fmt.Errorf("idle TTL %s is negative", p.IdleTTL)
	case p.MaxAge < 0:
		return fmt.Errorf("max age %s is negative", p.MaxAge)
	case p.InputRequiredTimeout < 0:
		return fmt.Errorf("input-required timeout %s is negative", p.InputRequiredTimeout)
	case p.FirstEventTimeout < 0:
		return fmt.Errorf("first event timeout %s is negative", p.FirstEventTimeout)
	case p.MaxConcurrentTasksPerContext < 0:
		return fmt.Errorf("max concurrent tasks per context %d is negative", p.MaxConcurrentTasksPerContext)
	case p.MaxActiveContextsPerAgent < 0:
		return fmt.Errorf("max active contexts per agent %d is negative", p.MaxActiveContextsPerAgent)
	case p.MaxActiveContextsPerCaller < 0:
		return fmt.Errorf("max active contexts per caller %d is negative", p.MaxActiveContextsPerCaller)
	case p.HistoryTasksPerContext < 0:
		return fmt.Errorf("history tasks per context %d is negative", p.HistoryTasksPerContext)
	case p.TombstoneTTL < 0:
		return fmt.Errorf("tombstone TTL %s is negative", p.TombstoneTTL)
	case p.MaxStreamsPerTask < 0:
		return fmt.Errorf("max streams per task %d is negative", p.MaxStreamsPerTask)
	case p.MaxHistoryBytes < 0:
		return fmt.Errorf("history bytes per context %d is negative", p.MaxHistoryBytes)
	}
	switch p.History {
	case "", v1alpha1.HistoryNone, v1alpha1.HistorySummaries, v1alpha1.HistoryMessages:
	default:
		return fmt.Errorf("history mode %q is not None, Summaries or Messages", p.History)
	}
	return nil
}

// fingerprint identifies the durations that deadlines derive from, so the
// engine can tell a context's stored deadlines are current without
// recomputing them (FNV-1a over the five values).
func (p Policy) fingerprint() uint64 {
	h := uint64(14695981039346656037)
	for _, d := range []time.Duration{p.IdleTTL, p.MaxAge, p.InputRequiredTimeout, p.tombstoneTTL(), p.FirstEventTimeout} {
		v := uint64(d)
		for i := 0; i < 8; i++ {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	return h | 1 // never 0, the value of contexts stored before fingerprints
}

// CallerShare is how many unexpired contexts a caller may hold at one agent
// when it opens a new one, while callers callers (itself included) hold
// contexts there: MaxActiveContextsPerCaller when set; otherwise the fair
// share ceil(MaxActiveContextsPerAgent / (callers+1)), which always keeps one
// share free for a caller that holds none yet, so no caller, however busy,
// can take the whole agent (a caller alone gets half of it); 0 (unlimited)
// when neither limit is set.
func (p Policy) CallerShare(callers int) int {
	if p.MaxActiveContextsPerCaller > 0 {
		return p.MaxActiveContextsPerCaller
	}
	l := p.MaxActiveContextsPerAgent
	if l <= 0 {
		return 0
	}
	n := max(callers, 1) + 1
	return (l + n - 1) / n
}

func (p Policy) history() int {
	if p.HistoryTasksPerContext <= 0 {
		return DefaultHistoryTasksPerContext
	}
	return p.HistoryTasksPerContext
}

func (p Policy) tombstoneTTL() time.Duration {
	if p.TombstoneTTL <= 0 {
		return DefaultTombstoneTTL
	}
	return p.TombstoneTTL
}

func (p Policy) maxStreams() int {
	if p.MaxStreamsPerTask <= 0 {
		return DefaultMaxStreamsPerTask
	}
	return p.MaxStreamsPerTask
}
