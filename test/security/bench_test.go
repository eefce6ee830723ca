package security_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// BenchmarkFloodIsolation: does one tenant's flood leave another tenant's latency alone?
// The victim (the console of tenant victim) sends sequential requests to its gated helper, first
// on a quiet service, then while mallory (namespace evil) floods its own gated trap with
// FLOOD_RATE requests per second (default 1 000, 4× the review's flood; 0: as fast as 8
// publishers on its one connection can). The figure is the victim's p90 under the flood over its
// p90 in quiet, measured in the same run, for the caller rate off, the default, and 100/s.
// Target (issue 22): ≤ 1.5 with the limit on. Run:
//
//	make tools-test && KUBEBUILDER_ASSETS=$(hack/build-control-plane.sh --print-assets) \
//	  go test ./test/security/ -run '^$' -bench FloodIsolation -benchtime 1x -timeout 20m
//
// FLOOD_VICTIM_REQUESTS (default 500, 10 s a phase) sets the victim's requests per phase. Everything (broker,
// service, agents, both clients) shares the machine's cores: a flood faster than the broker can
// take slows every client of it, which no limit in the service can prevent.
func BenchmarkFloodIsolation(b *testing.B) {
	requests, rate := 500, 1000
	if v := os.Getenv("FLOOD_VICTIM_REQUESTS"); v != "" {
		_, _ = fmt.Sscan(v, &requests)
	}
	if v := os.Getenv("FLOOD_RATE"); v != "" {
		_, _ = fmt.Sscan(v, &rate)
	}
	for _, kind := range testenv.BrokerKinds {
		b.Run(kind, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()
			w := newServiceWorld(b, ctx, startServiceBroker(b, ctx, kind, false), -1, 0)
			w.durable = true // as in production: every served request pays its fsyncs
			console := w.listen(b, ctx, w.console)
			flooder := dialRaw(b, ctx, w.b.addr, w.mallory, w.passwords[w.mallory]) // reads none of its answers
			for _, mode := range []struct {
				name  string
				rate  float64
				burst int
			}{
				{"limit=off", -1, 0},
				{fmt.Sprintf("limit=default(%d/s)", convservice.DefaultCallerRate), 0, 0},
				{"limit=100/s", 100, 200},
			} {
				w.startService(b, ctx, "bench-"+strings.NewReplacer("=", "-", "(", "-", ")", "", "/", "-").Replace(mode.name), mode.rate, mode.burst)
				victim(b, ctx, w, console, 25) // warm up
				quiet := victim(b, ctx, w, console, requests)
				limitedBefore := w.rejections(b, rpcerr.NameRateLimited)
				stop := flood(ctx, w, flooder, rate)
				time.Sleep(time.Second) // the flood in full swing
				loaded := victim(b, ctx, w, console, requests)
				sent, elapsed := stop()
				limited := w.rejections(b, rpcerr.NameRateLimited) - limitedBefore
				ratio := float64(p(loaded, 90)) / float64(p(quiet, 90))
				b.Logf("%s %s: victim p50 %s -> %s, p90 %s -> %s (%.2fx); flood %d requests in %s (%.0f/s), %.0f rate limited; loadavg %s",
					kind, mode.name, p(quiet, 50), p(loaded, 50), p(quiet, 90), p(loaded, 90), ratio,
					sent, elapsed.Round(time.Millisecond), float64(sent)/elapsed.Seconds(), limited, hostload.Average())
				b.ReportMetric(ratio, mode.name+"-p90-ratio")
			}
		})
	}
}

// victim sends n requests from the console to its helper, one every 20 ms (a steady 50 per
// second, within every limit measured), and returns their latencies; each must be served.
func victim(b *testing.B, ctx context.Context, w *serviceWorld, console *rawClient, n int) []time.Duration {
	b.Helper()
	out := make([]time.Duration, 0, n)
	next := time.Now()
	for i := range n {
		time.Sleep(time.Until(next))
		next = next.Add(20 * time.Millisecond)
		corr := []byte(fmt.Sprintf("victim-%d-%d", time.Now().UnixNano(), i))
		have := console.count()
		began := time.Now()
		console.publish(b, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("bench"), corr, sendMessage("measure"), ""))
		reply := console.waitFor(have, corr, 30*time.Second)
		if reply == nil {
			b.Fatalf("victim request %d not answered", i)
		}
		if !strings.Contains(string(reply.Payload), "hello from helper") {
			b.Fatalf("victim request %d not served: %s", i, reply.Payload)
		}
		out = append(out, time.Since(began))
	}
	return out
}

// flood publishes requests from mallory to its trap at rate per second (open loop, paced every
// 10 ms, 8 publishers on its one connection; 0: as fast as they can) until stopped, and returns
// how many it sent and how long it ran.
func flood(ctx context.Context, w *serviceWorld, c *rawClient, rate int) (stop func() (int64, time.Duration)) {
	var sent atomic.Int64
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	began := time.Now()
	work := make(chan int, 1<<16)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var i int
				if rate > 0 {
					select {
					case i = <-work:
					case <-fctx.Done():
						return
					}
				} else if fctx.Err() != nil {
					return
				} else {
					i = int(sent.Load())
				}
				corr := []byte(fmt.Sprintf("flood-%d-%d", time.Now().UnixNano(), i))
				if _, err := c.c.Publish(fctx, request(w.trap.RequestTopic(), w.mallory.ReplyTopic("flood"), corr, sendMessage("flood"), "")); err == nil {
					sent.Add(1)
				}
			}
		}()
	}
	if rate > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			due := 0
			for i := 0; ; {
				select {
				case <-fctx.Done():
					return
				case now := <-t.C:
					// Catch up to rate × elapsed, whatever the ticker's jitter.
					for due = int(now.Sub(began).Seconds() * float64(rate)); i < due; i++ {
						select {
						case work <- i:
						default: // the publishers are behind: the offered rate is what they manage
						}
					}
				}
			}
		}()
	}
	return func() (int64, time.Duration) {
		cancel()
		wg.Wait()
		return sent.Load(), time.Since(began)
	}
}

func p(d []time.Duration, q int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*q/100]
}
