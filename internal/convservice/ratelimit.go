package convservice

import (
	"fmt"
	"math"
	"sync"
	"time"

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

// CodeRateLimited (pkg/rpcerr) is the JSON-RPC error code of a request refused for its caller's
// rate; data carries a2a_error "rate_limited" (also the rejections_total reason of the requests
// answered with it) and retry_after, the seconds until it would be admitted.
const CodeRateLimited = rpcerr.CodeRateLimited

// reasonRateLimitedUnanswered counts (rejections_total) the requests beyond twice their caller's
// rate, dropped without an answer.
const reasonRateLimitedUnanswered = "rate_limited_unanswered"

// Defaults of Config.CallerRate and CallerBurst.
const (
	DefaultCallerRate  = 200
	DefaultCallerBurst = 400
)

// callerLimiter holds the callers' buckets.
type callerLimiter struct {
	limit rate.Limit
	burst int

	mu        sync.Mutex
	buckets   map[a2amqtt.AgentRef]*callerBuckets
	lastPrune time.Time
}

// callerBuckets are a caller's requests and its rate-limit answers.
type callerBuckets struct{ serve, answer *rate.Limiter }

// pruneEvery bounds the memory of callers that stopped asking: a full bucket is forgotten (it
// would be recreated full).
const pruneEvery = time.Minute

func newCallerLimiter(perSecond float64, burst int) *callerLimiter {
	if perSecond < 0 {
		return nil // unlimited
	}
	return &callerLimiter{limit: rate.Limit(perSecond), burst: burst, buckets: map[a2amqtt.AgentRef]*callerBuckets{}}
}

// allow takes a token of caller's bucket. When there is none it returns how long until one, and
// whether the refusal is to be answered (a token of the answers' bucket).
func (l *callerLimiter) allow(caller a2amqtt.AgentRef, now time.Time) (ok bool, wait time.Duration, answer bool) {
	if l == nil {
		return true, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastPrune) > pruneEvery {
		for ref, b := range l.buckets {
			if b.serve.TokensAt(now) >= float64(l.burst) && b.answer.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, ref)
			}
		}
		l.lastPrune = now
	}
	b := l.buckets[caller]
	if b == nil {
		b = &callerBuckets{serve: rate.NewLimiter(l.limit, l.burst), answer: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[caller] = b
	}
	if b.serve.AllowN(now, 1) {
		return true, 0, false
	}
	wait = time.Duration(math.MaxInt64)
	if l.limit > 0 {
		// The deficit below one token, at the bucket's rate.
		wait = time.Duration((1 - b.serve.TokensAt(now)) / float64(l.limit) * float64(time.Second))
	}
	return false, wait, b.answer.AllowN(now, 1)
}

// rateLimitedError is the answer to a request beyond its caller's rate.
func (l *callerLimiter) rateLimitedError(caller a2amqtt.AgentRef, wait time.Duration) *a2amqtt.RPCError {
	retryAfter := math.Ceil(wait.Seconds()*1000) / 1000
	return rpcerr.New(rpcerr.NameRateLimited, fmt.Sprintf(
		"too many requests from %s: at most %g per second (bursts of %d) per conversation service replica; retry after %.3fs",
		caller, float64(l.limit), l.burst, retryAfter),
		map[string]any{"retry_after": retryAfter, "caller": caller.String(), "rate": float64(l.limit), "burst": l.burst})
}
