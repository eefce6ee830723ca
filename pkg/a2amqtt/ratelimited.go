package a2amqtt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// A -32070 rate_limited answer (a2a-fleet's conversation service, ErrRateLimited) says when the
// request would be admitted: error.data.retry_after, in seconds. The requester honours it: the
// call waits that long (jittered upwards, never less) and sends the request again with new
// Correlation Data, the same JSON-RPC id and Task.id, as a new attempt of the same call: the
// service refused it before doing anything with it (no store write, no forward). It gives up and
// returns the answer (ErrRateLimited, retry_after in its data) only when the wait would pass the
// call's deadline (its context's, bounded by RetryPolicy.RateLimitMaxWait) or the call already
// used RetryPolicy.RateLimitRetries retries. Requester.RateLimitRetries and RateLimitGiveUps
// count both outcomes.

// Defaults of RetryPolicy.RateLimitRetries and RateLimitMaxWait: ten waits of a few ms each are
// what a sequential caller a little over its rate needs; 30 s is the profile's first reply
// timeout twice, so a call without a deadline still ends.
const (
	defaultRateLimitRetries = 10
	defaultRateLimitMaxWait = 30 * time.Second
)

// rateLimitCounters are a requester's counts of calls sent again after -32070 and of calls that
// returned it.
type rateLimitCounters struct {
	retries, giveUps atomic.Uint64
}

// RateLimitRetries counts the requests this requester sent again after a -32070 rate_limited
// answer, once its retry_after passed.
func (r *Requester) RateLimitRetries() uint64 { return r.rateLimit.retries.Load() }

// RateLimitGiveUps counts the calls that returned ErrRateLimited: waiting retry_after would have
// passed the call's deadline, or its retries were used up.
func (r *Requester) RateLimitGiveUps() uint64 { return r.rateLimit.giveUps.Load() }

// HistoryRateLimitRetries counts the history reads (ResponderOptions.HistoryFrom) sent again
// after a -32070 rate_limited answer; 0 without HistoryFrom.
func (r *Responder) HistoryRateLimitRetries() uint64 {
	if r.history == nil {
		return 0
	}
	return r.history.RateLimitRetries()
}

// rateLimitWaits is one call's rate-limit state: its deadline and retries so far.
type rateLimitWaits struct {
	r        *Requester
	deadline time.Time
	retries  int
}

// newRateLimitWaits starts a call's state (a value: it stays on the call's stack).
func (r *Requester) newRateLimitWaits(ctx context.Context) rateLimitWaits {
	deadline := time.Now().Add(r.retry.RateLimitMaxWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return rateLimitWaits{r: r, deadline: deadline}
}

// afterReply decides what a first reply means for the call: retry true when it was a rate_limited
// answer and the call waited its retry_after; an error when it was one the call cannot wait for
// (the answer itself, wrapped) or the wait was cut short. Any other reply: false, nil.
func (w *rateLimitWaits) afterReply(ctx context.Context, c call, p *paho.Publish) (retry bool, err error) {
	refusal, after, limited := rateLimitedAnswer(p)
	if !limited {
		return false, nil
	}
	wait := w.r.retry.rateLimitDelay(after, w.retries+1)
	if w.retries >= w.r.retry.RateLimitRetries || time.Now().Add(wait).After(w.deadline) {
		w.r.rateLimit.giveUps.Add(1)
		return false, fmt.Errorf("a2amqtt: %s to %s rate limited after %d retries (retry_after %s does not fit the call's deadline or retry budget): %w",
			c.method, c.target, w.retries, after, refusal)
	}
	w.retries++
	w.r.rateLimit.retries.Add(1)
	w.r.log.Debug("rate limited; retrying after retry_after", "method", c.method, "target", c.target.String(), "retry_after", after, "wait", wait, "retry", w.retries)
	if err := sleepCtx(ctx, wait); err != nil {
		return false, errors.Join(err, refusal)
	}
	return true, nil
}

// rateLimitDelay is the wait before retry n (1-based) after a retry_after of after: after plus up
// to Jitter×n of it (at least a millisecond's worth), so that the requests of one identity
// refused together do not come back together, and spread more each time they collide again.
func (p RetryPolicy) rateLimitDelay(after time.Duration, n int) time.Duration {
	spread := max(after, time.Millisecond)
	return after + time.Duration(float64(spread)*p.Jitter*float64(n)*mrand.Float64())
}

// codeRateLimitedJSON is how -32070 appears in a JSON-RPC error: a cheap test before decoding.
var codeRateLimitedJSON = []byte(strconv.Itoa(CodeRateLimited))

// rateLimitedAnswer reports whether p is a -32070 rate_limited answer, with its error and
// retry_after (0 when absent or malformed).
func rateLimitedAnswer(p *paho.Publish) (*RPCError, time.Duration, bool) {
	if !bytes.Contains(p.Payload, codeRateLimitedJSON) {
		return nil, 0, false
	}
	var resp struct {
		Error *RPCError `json:"error"`
	}
	if json.Unmarshal(p.Payload, &resp) != nil || resp.Error == nil || !errors.Is(resp.Error, ErrRateLimited) {
		return nil, 0, false
	}
	after, _ := RetryAfterOf(resp.Error)
	return resp.Error, after, true
}

// RetryAfterOf returns error.data.retry_after of a -32070 rate_limited error in err's chain: how
// long until the service would admit the request.
func RetryAfterOf(err error) (time.Duration, bool) {
	var e *RPCError
	if !errors.As(err, &e) || !errors.Is(e, ErrRateLimited) {
		return 0, false
	}
	s, ok := e.Details()["retry_after"].(float64)
	if !ok || s < 0 {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}
