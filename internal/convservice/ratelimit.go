package convservice

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"golang.org/x/time/rate"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// Per-caller request rate (docs/conversation-service.md, "Limits"): every verified caller has a
// token bucket per replica, CallerRate requests per second with bursts of CallerBurst, shared by
// its requests to every gated agent and its history queries. It is checked as the message
// arrives, before it is queued for a worker, so a flood never waits in front of other callers'
// requests. A request beyond it is answered with CodeRateLimited and retry_after (seconds) in
// data, by a goroutine of its own, and goes no further: no store write, no forward. Those answers
// have a bucket of the same size: a caller that ignores retry_after and sends more than twice
// its rate gets the excess dropped unanswered (counted), so answering a flood cannot cost the
// broker as much as the flood itself.
//
// A governed agent reading the history of its own conversations (GetTask/ListTasks with no
// tenant or its own) is not a caller of the service but part of answering one: each of those
// reads serves a turn the service relayed to it, already charged to that turn's caller. They
// have a budget of their own per agent, AgentHistoryRate with bursts of AgentHistoryBurst, sized
// to what a replica relays rather than to one caller, so an agent that answers its callers
// within their limits never has its own history read refused, and one that loops on it is still
// bounded.

// CodeRateLimited (pkg/rpcerr) is the JSON-RPC error code of a request refused for its caller's
// rate; data carries a2a_error "rate_limited" (also the rejections_total reason of the requests
// answered with it) and retry_after, the seconds until it would be admitted.
const CodeRateLimited = rpcerr.CodeRateLimited

// reasonRateLimitedUnanswered counts (rejections_total) the requests beyond twice their caller's
// rate, dropped without an answer.
const reasonRateLimitedUnanswered = "rate_limited_unanswered"

// Defaults of Config.CallerRate and CallerBurst, AgentHistoryRate and AgentHistoryBurst
// (docs/conversation-service.md, "Limits", says how they were sized).
const (
	DefaultCallerRate        = 200
	DefaultCallerBurst       = 400
	DefaultAgentHistoryRate  = 2000
	DefaultAgentHistoryBurst = 4000
)

// budget is what a bucket is charged for.
type budget int

const (
	// budgetCaller: a caller's requests to gated agents and its history queries.
	budgetCaller budget = iota
	// budgetAgentHistory: a governed agent's reads of its own conversations' history.
	budgetAgentHistory
)

// bucketKey names one identity's bucket of one budget.
type bucketKey struct {
	ref    a2amqtt.AgentRef
	budget budget
}

// budgetRate is one budget's rate and burst.
type budgetRate struct {
	limit rate.Limit
	burst int
}

// callerLimiter holds the callers' (and the agents' own history) buckets.
type callerLimiter struct {
	rates [2]budgetRate // by budget

	mu        sync.Mutex
	buckets   map[bucketKey]*callerBuckets
	lastPrune time.Time
}

// callerBuckets are a caller's requests and its rate-limit answers.
type callerBuckets struct{ serve, answer *rate.Limiter }

// pruneEvery bounds the memory of callers that stopped asking: a full bucket is forgotten (it
// would be recreated full).
const pruneEvery = time.Minute

// newCallerLimiter limits callers to perSecond with bursts of burst, and governed agents' reads
// of their own history to historyPerSecond with bursts of historyBurst. A negative perSecond
// means no limit at all (nil); a negative historyPerSecond, none on the agents' own reads.
func newCallerLimiter(perSecond float64, burst int, historyPerSecond float64, historyBurst int) *callerLimiter {
	if perSecond < 0 {
		return nil // unlimited
	}
	l := &callerLimiter{buckets: map[bucketKey]*callerBuckets{}}
	l.rates[budgetCaller] = budgetRate{limit: rate.Limit(perSecond), burst: burst}
	l.rates[budgetAgentHistory] = budgetRate{limit: rate.Limit(historyPerSecond), burst: historyBurst}
	if historyPerSecond < 0 {
		l.rates[budgetAgentHistory] = budgetRate{limit: rate.Inf}
	}
	return l
}

// allow takes a token of caller's bucket. When there is none it returns how long until one, and
// whether the refusal is to be answered (a token of the answers' bucket).
func (l *callerLimiter) allow(caller a2amqtt.AgentRef, now time.Time) (ok bool, wait time.Duration, answer bool) {
	return l.allowOf(bucketKey{ref: caller, budget: budgetCaller}, now)
}

// allowOf is allow on key's bucket.
func (l *callerLimiter) allowOf(key bucketKey, now time.Time) (ok bool, wait time.Duration, answer bool) {
	if l == nil {
		return true, 0, false
	}
	r := l.rates[key.budget]
	if r.limit == rate.Inf {
		return true, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastPrune) > pruneEvery {
		for k, b := range l.buckets {
			full := float64(l.rates[k.budget].burst)
			if b.serve.TokensAt(now) >= full && b.answer.TokensAt(now) >= full {
				delete(l.buckets, k)
			}
		}
		l.lastPrune = now
	}
	b := l.buckets[key]
	if b == nil {
		b = &callerBuckets{serve: rate.NewLimiter(r.limit, r.burst), answer: rate.NewLimiter(r.limit, r.burst)}
		l.buckets[key] = b
	}
	if b.serve.AllowN(now, 1) {
		return true, 0, false
	}
	wait = time.Duration(math.MaxInt64)
	if r.limit > 0 {
		// The deficit below one token, at the bucket's rate.
		wait = time.Duration((1 - b.serve.TokensAt(now)) / float64(r.limit) * float64(time.Second))
	}
	return false, wait, b.answer.AllowN(now, 1)
}

// rateLimitedError is the answer to a request beyond its caller's rate.
func (l *callerLimiter) rateLimitedError(caller a2amqtt.AgentRef, wait time.Duration) *a2amqtt.RPCError {
	return l.rateLimitedErrorOf(bucketKey{ref: caller, budget: budgetCaller}, wait)
}

// rateLimitedErrorOf is the answer to a request beyond key's budget.
func (l *callerLimiter) rateLimitedErrorOf(key bucketKey, wait time.Duration) *a2amqtt.RPCError {
	r := l.rates[key.budget]
	retryAfter := math.Ceil(wait.Seconds()*1000) / 1000
	what, data := "requests from", map[string]any{"retry_after": retryAfter, "caller": key.ref.String(), "rate": float64(r.limit), "burst": r.burst}
	if key.budget == budgetAgentHistory {
		what, data["budget"] = "reads of its own history by", "agent_history"
	}
	return rpcerr.New(rpcerr.NameRateLimited, fmt.Sprintf(
		"too many %s %s: at most %g per second (bursts of %d) per conversation service replica; retry after %.3fs",
		what, key.ref, float64(r.limit), r.burst, retryAfter), data)
}

// withinOwnHistoryRate is withinRate for a governed agent's read of its own conversations'
// history: charged to the agent's own-history budget, not to its bucket as a caller, and
// refused the same way (answered -32070 with retry_after, or dropped past twice the budget).
func (s *admission) withinOwnHistoryRate(in *inbound) bool {
	if s.limiter == nil || in.rateChecked {
		return true
	}
	in.rateChecked = true
	key := bucketKey{ref: in.caller, budget: budgetAgentHistory}
	ok, wait, answer := s.limiter.allowOf(key, time.Now())
	if !ok {
		s.refuseForRate(in, key, wait, answer)
	}
	return ok
}

// refuseForRate answers a request refused for key's budget with -32070 and retry_after (queued
// for answerRateLimited), or drops it when the refusal is not to be answered; counted either way.
func (s *admission) refuseForRate(in *inbound, key bucketKey, wait time.Duration, answer bool) {
	if !answer {
		s.m.rejections.WithLabelValues(reasonRateLimitedUnanswered).Inc()
		return
	}
	s.m.rejections.WithLabelValues(rpcerr.NameRateLimited).Inc()
	var probe struct {
		ID any `json:"id"`
	}
	_ = json.Unmarshal(in.payload, &probe) // the id, when there is one to echo
	b, err := encodeResponse(probe.ID, nil, s.limiter.rateLimitedErrorOf(key, wait))
	if err != nil {
		s.log.Error(err, "encode rate-limit answer")
		return
	}
	select {
	case s.rateAnswers <- &paho.Publish{Topic: in.respTo, QoS: 1, Payload: b,
		Properties: &paho.PublishProperties{CorrelationData: in.corr, ContentType: "application/json"}}:
	default:
		s.m.rejections.WithLabelValues(reasonRateLimitedUnanswered).Inc()
	}
}
