package convservice

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Per-caller request rate (docs/conversation-service.md, "Limits"): every verified caller has a
// token bucket per replica, CallerRate requests per second with bursts of CallerBurst, shared by
// its requests to every gated agent and its history queries. A request beyond it is answered at
// once with CodeRateLimited and retry_after (seconds) in data, and goes no further: it costs the
// service a decision and an answer, not a store write or a forward, so one tenant's flood cannot
// take the workers and the agents from the others.

// CodeRateLimited is the JSON-RPC error code of a request refused for its caller's rate; data
// carries a2a_error "rate_limited" and retry_after, the seconds until it would be admitted.
const CodeRateLimited = -32064

// A2AErrorRateLimited is the a2a_error of CodeRateLimited.
const A2AErrorRateLimited = "rate_limited"

// Defaults of Config.CallerRate and CallerBurst.
const (
	DefaultCallerRate  = 1000
	DefaultCallerBurst = 2000
)

// callerLimiter holds the callers' buckets.
type callerLimiter struct {
	limit rate.Limit
	burst int

	mu        sync.Mutex
	buckets   map[a2amqtt.AgentRef]*rate.Limiter
	lastPrune time.Time
}

// pruneEvery bounds the memory of callers that stopped asking: a full bucket is forgotten (it
// would be recreated full).
const pruneEvery = time.Minute

func newCallerLimiter(perSecond float64, burst int) *callerLimiter {
	if perSecond < 0 {
		return nil // unlimited
	}
	return &callerLimiter{limit: rate.Limit(perSecond), burst: burst, buckets: map[a2amqtt.AgentRef]*rate.Limiter{}}
}

// allow takes a token of caller's bucket; when there is none it returns how long until one.
func (l *callerLimiter) allow(caller a2amqtt.AgentRef, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastPrune) > pruneEvery {
		for ref, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, ref)
			}
		}
		l.lastPrune = now
	}
	b := l.buckets[caller]
	if b == nil {
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[caller] = b
	}
	if b.AllowN(now, 1) {
		return true, 0
	}
	if l.limit <= 0 {
		return false, time.Duration(math.MaxInt64)
	}
	// The deficit below one token, at the bucket's rate.
	missing := 1 - b.TokensAt(now)
	return false, time.Duration(missing / float64(l.limit) * float64(time.Second))
}

// rateLimitedError is the answer to a request beyond its caller's rate.
func (l *callerLimiter) rateLimitedError(caller a2amqtt.AgentRef, wait time.Duration) *a2amqtt.RPCError {
	retryAfter := math.Ceil(wait.Seconds()*1000) / 1000
	data, _ := json.Marshal(map[string]any{
		"a2a_error": A2AErrorRateLimited, "retry_after": retryAfter,
		"caller": caller.String(), "rate": float64(l.limit), "burst": l.burst,
	})
	return &a2amqtt.RPCError{Code: CodeRateLimited, Data: data, Message: fmt.Sprintf(
		"too many requests from %s: at most %g per second (bursts of %d) per conversation service replica; retry after %.3fs",
		caller, float64(l.limit), l.burst, retryAfter)}
}
