package registration_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/controllers"
)

// BenchmarkFleetFinalizerAtAdmission is the embedded fleet benchmark without the finalizer policy
// (the operator updates every new Agent to add its finalizer), then with it
// (config/admission/agent-finalizer.yaml adds it at CREATE), in the same run: the API server's
// requests and CPU per Agent of one write fewer (docs/benchmarks.md, docs/registration.md).
//
//	FLEET_SIZES=1000 go test ./test/registration -run '^$' -bench FleetFinalizerAtAdmission -benchtime 1x
func BenchmarkFleetFinalizerAtAdmission(b *testing.B) {
	for _, n := range fleetSizes("FLEET_SIZES", "1000") {
		for _, policy := range []bool{false, true} {
			b.Run(fmt.Sprintf("%d/policy=%v", n, policy), func(b *testing.B) {
				for range b.N {
					runFleetBenchmark(b, n, "embedded", func(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options) (fleetOperator, string) {
						if policy {
							installFinalizerPolicy(b, ctx, ns)
						}
						c := startChildOperator(b, ctx, cp.Config, ns, copts.MaxConcurrentReconciles, false)
						return c, c.brokerAddr
					})
				}
			})
		}
	}
}
