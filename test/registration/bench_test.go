package registration_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// The fleet benchmark applies fleets of Agents against the real control plane and a real broker
// and measures, per fleet size, in one table:
//
//   - the time from applying the fleet until every Agent is Ready, and per Agent;
//   - the operator process's peak RSS during that size (its caches and broker runtime, and the
//     embedded broker, which lives in the operator's process; on the embedded broker the
//     operator runs in a process of its own, fleetoperator_test.go, so the benchmark's creators,
//     Ready tracker and witness clients are not in the figure; on Mosquitto it runs in the test
//     process and the figure includes them);
//   - CPU per Agent of each process: the operator, the benchmark, kube-apiserver and etcd;
//   - broker commands, round trips and reads per Agent (acl.Stats);
//   - apiserver writes per Agent by the operator (a counting transport on its client), by
//     resource;
//   - collateral kicks: witness agents connected with real MQTT clients before the rest of the
//     fleet is applied must never be disconnected (and the embedded broker's own kick count).
//
//	make bench-fleet                                     # embedded 1000,3000,10000; Mosquitto 1000,3000
//	FLEET_SIZES=1000 go test ./test/registration -run '^$' -bench FleetRegistrationEmbedded -benchtime 1x
//
// FLEET_SIZES (embedded) and MOSQUITTO_FLEET_SIZES override the sizes (FLEET_AGENTS, a single
// size, is still honoured for both); FLEET_HEAPPROFILE_DIR writes a heap profile of the operator
// per size once the whole fleet is Ready; FLEET_PROGRESS logs progress every 10 s;
// FLEET_OPERATOR_IN_PROCESS runs the embedded benchmark's operator in the test process.

// BenchmarkFleetRegistrationEmbedded runs the fleet on the embedded broker (the operator's own
// throughput), the operator in a process of its own (fleetoperator_test.go).
func BenchmarkFleetRegistrationEmbedded(b *testing.B) {
	for _, n := range fleetSizes("FLEET_SIZES", "1000,3000,10000") {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				runFleetBenchmark(b, n, "embedded", startEmbeddedOperator)
			}
		})
	}
}

// BenchmarkFleetCardSigning is the fleet benchmark with card signing on and off in the same
// run, one leg after the other, on each broker of FLEET_SIGNING_BROKERS (default
// embedded,table): the embedded broker (the operator in a process of its own, the broker in it)
// and Mosquitto 2.0.11 with the decision-table plugin (the shipped default; its own process, the
// operator in the test process). It measures the rollout cost of signing every card
// (docs/benchmarks.md). FLEET_SIGNING_ORDER is the order of the legs on each broker (default
// off,on,on,off: the control plane keeps every earlier leg's fleet, so kube-apiserver's CPU per
// Agent grows from leg to leg; in this order a linear drift weighs the same on both kinds, and
// the two legs of a kind differing shows it).
//
// Wall time at this size moves with the machine's load more than signing costs, and so does
// kube-apiserver's CPU per Agent (±5 % from leg to leg). The last leg of each broker reports,
// over the legs' means: the CPU per Agent of every process of the run (operator, broker,
// benchmark, kube-apiserver, etcd), signing on ÷ off; and signing's share of the rollout's CPU,
// the extra CPU per Agent with signing on of the processes signing adds work to (the operator,
// which signs, and the broker, which carries the longer cards: one process on the embedded
// broker, the test process and Mosquitto on the table) over every process's CPU per Agent with
// it off. kube-apiserver sees the same writes either way, so that share is the figure the noise
// of the other processes does not drown; at 10 000 Agents and more the benchmark fails when it
// exceeds 5 % (the target: signing costs the rollout ≤ 5 %).
//
//	FLEET_SIZES=10000 go test ./test/registration -run '^$' -bench FleetCardSigning -benchtime 1x
func BenchmarkFleetCardSigning(b *testing.B) {
	order := strings.Split(cmp.Or(os.Getenv("FLEET_SIGNING_ORDER"), "off,on,on,off"), ",")
	brokers := strings.Split(cmp.Or(os.Getenv("FLEET_SIGNING_BROKERS"), "embedded,table"), ",")
	for _, n := range fleetSizes("FLEET_SIZES", "1000") {
		for _, broker := range brokers {
			broker = strings.TrimSpace(broker)
			start, ok := signingOperators[broker]
			if !ok {
				b.Fatalf("FLEET_SIGNING_BROKERS: unknown broker %q (embedded, table)", broker)
			}
			runSigningLegs(b, n, broker, order, start)
		}
	}
}

// signingOperators start the operator, signing cards or not, on each broker of the signing
// benchmark.
var signingOperators = map[string]func(signing bool) operatorStarter{
	"embedded": func(signing bool) operatorStarter {
		return func(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options) (fleetOperator, string) {
			c := startChildOperator(b, ctx, cp.Config, ns, copts.MaxConcurrentReconciles, signing)
			return c, c.brokerAddr
		}
	},
	"table": startTableOperator,
}

// runSigningLegs runs the legs of order on one broker and reports the cost of signing after the
// last.
func runSigningLegs(b *testing.B, n int, broker string, order []string, start func(signing bool) operatorStarter) {
	legs := map[bool][]signingLeg{}
	for leg, o := range order {
		signing := strings.TrimSpace(o) == "on"
		label := fmt.Sprintf("%s-signing-%s-%d", broker, map[bool]string{true: "on", false: "off"}[signing], leg+1)
		b.Run(fmt.Sprintf("%d/%s/%d-signing=%v", n, broker, leg+1, signing), func(b *testing.B) {
			for range b.N {
				var ns map[string]string
				var brokerAddr string
				row := runFleetBenchmark(b, n, label, func(b *testing.B, ctx context.Context, namespaces map[string]string, copts controllers.Options) (fleetOperator, string) {
					op, addr := start(signing)(b, ctx, namespaces, copts)
					ns, brokerAddr = namespaces, addr
					return op, addr
				})
				checkCardSigned(b, ns, brokerAddr, n, signing)
				applied := float64(n - row.witnesses)
				l := signingLeg{all: row.cpuTotal() * 1000 / applied, operator: row.cpu.operator * 1000 / applied, broker: row.brokerCPU * 1000 / applied}
				b.ReportMetric(l.all, "cpu-ms/agent-all")
				legs[signing] = append(legs[signing], l)
			}
			if leg == len(order)-1 {
				// The last leg reports the run's figures (a parent benchmark's log is not printed).
				reportSigningCost(b, n, broker, order, legs)
			}
		})
	}
}

// checkCardSigned reads, as one of the fleet's agents (a witness, whose connection it takes
// over), its own retained card from the broker and fails unless the card carries signatures
// exactly when the leg signs: the leg measured what it says.
func checkCardSigned(b *testing.B, ns map[string]string, brokerAddr string, n int, signing bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := benchAgent(ns, min(2, n-1)) // agent 2 reads its org's discovery topics (SameOrg)
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: identity.CredentialsSecretName(a)}, s); err != nil {
		b.Fatalf("card check: %v", err)
	}
	id := identity.Of(a)
	c := brokertest.MustDial(b, brokerAddr, brokertest.Options{Username: identity.Username(id), Password: string(s.Data[identity.SecretKeyPassword]), ClientID: id.ClientID()})
	defer c.Close()
	if code := c.Subscribe(id.DiscoveryTopic()); code >= 0x80 {
		b.Fatalf("card check: subscribe %s: %#x", id.DiscoveryTopic(), code)
	}
	p, err := c.Next(10 * time.Second)
	if err != nil {
		b.Fatalf("card check: no retained card on %s: %v", id.DiscoveryTopic(), err)
	}
	var card struct {
		Signatures []json.RawMessage `json:"signatures"`
	}
	if err := json.Unmarshal(p.Payload, &card); err != nil {
		b.Fatalf("card check: card on %s: %v", id.DiscoveryTopic(), err)
	}
	if signed := len(card.Signatures) > 0; signed != signing {
		b.Fatalf("card check: the card on %s has %d signatures in a leg with signing %v", id.DiscoveryTopic(), len(card.Signatures), signing)
	}
}

// signingLeg is one leg's CPU per Agent, in ms: every process of the run, the operator's, and
// the broker's own process's (0 when the broker lives in the operator's).
type signingLeg struct{ all, operator, broker float64 }

// signers is the CPU per Agent of the processes signing adds work to: the operator and the broker.
func (l signingLeg) signers() float64 { return l.operator + l.broker }

func describeLegs(legs []signingLeg) string {
	var out []string
	for _, l := range legs {
		out = append(out, fmt.Sprintf("%.2f/%.2f/%.2f", l.all, l.operator, l.broker))
	}
	return strings.Join(out, " ")
}

func meanLeg(legs []signingLeg) (l signingLeg) {
	for _, x := range legs {
		l.all += x.all / float64(len(legs))
		l.operator += x.operator / float64(len(legs))
		l.broker += x.broker / float64(len(legs))
	}
	return l
}

// reportSigningCost reports, over the legs of one run on one broker, the CPU per Agent of every
// process, signing on ÷ off, and signing's share of the rollout's CPU (the operator's and the
// broker's extra CPU per Agent over every process's CPU per Agent with signing off); it fails at
// 10 000 Agents and more when that share exceeds 5 %.
func reportSigningCost(b *testing.B, n int, broker string, order []string, legs map[bool][]signingLeg) {
	if len(legs[true]) == 0 || len(legs[false]) == 0 {
		return // a leg failed or the order lacks one kind: no ratio
	}
	on, off := meanLeg(legs[true]), meanLeg(legs[false])
	ratio := on.all / off.all
	share := (on.signers() - off.signers()) / off.all
	b.ReportMetric(ratio, "signing-cpu-all-on/off")
	b.ReportMetric(on.operator/off.operator, "signing-cpu-operator-on/off")
	if off.broker > 0 {
		b.ReportMetric(on.broker/off.broker, "signing-cpu-broker-on/off")
	}
	b.ReportMetric(100*share, "signing-share-%")
	b.Logf("card signing at %d Agents on %s (legs %s, %s): CPU per Agent of every process on %.2f ms ÷ off %.2f ms = %.3f; "+
		"the operator's on %.2f ms ÷ off %.2f ms = %.3f; the broker process's on %.2f ms ÷ off %.2f ms; "+
		"signing's share of the rollout's CPU (operator and broker on − off) ÷ every process off = %+.1f %%; legs (every process / operator / broker, ms): on %s, off %s",
		n, broker, strings.Join(order, ","), hostload.Label(), on.all, off.all, ratio, on.operator, off.operator, on.operator/off.operator,
		on.broker, off.broker, 100*share, describeLegs(legs[true]), describeLegs(legs[false]))
	if n >= 10000 && share > 0.05 {
		b.Errorf("card signing costs the rollout of %d Agents on %s %.1f %% of its CPU (the operator's and the broker's extra CPU per Agent; target ≤ 5 %%)", n, broker, 100*share)
	}
}

// operatorStarter starts the operator of a fleet run for its namespaces and returns it and the
// address of its broker.
type operatorStarter func(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options) (fleetOperator, string)

// brokerProcess is implemented by an operator whose broker runs in a process of its own: the run
// counts that process's CPU too.
type brokerProcess interface{ brokerPID() int }

// withMosquitto is an operator whose broker is a Mosquitto process.
type withMosquitto struct {
	fleetOperator
	broker *brokertest.Mosquitto
}

func (o withMosquitto) brokerPID() int { return o.broker.PID() }

// startTableOperator starts, per run, Mosquitto 2.0.11 with the decision-table plugin and the
// operator in the test process against it, signing cards when signing is set (with a key
// generated into org0's namespace); both end with the run.
func startTableOperator(signing bool) operatorStarter {
	return func(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options) (fleetOperator, string) {
		broker := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{Table: &brokertest.TableOptions{}})
		user, pass := broker.TableAdmin()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		others := &collateralCounter{}
		backend, err := mosqtable.Connect(cctx, mosqtable.Config{URL: broker.URL(), Username: user, Password: pass, Logger: quiet, Timeout: time.Minute, OnKick: others.observe})
		cancel()
		if err != nil {
			b.Fatalf("connect decision table: %v", err)
		}
		b.Cleanup(func() {
			_ = backend.Close(context.Background())
			broker.Kill()
		})
		var signer *registration.CardSigning
		if signing {
			signer = &registration.CardSigning{Secret: client.ObjectKey{Namespace: ns["org0"], Name: "card-signing-keys"}, Generate: true, Reader: k8s}
		}
		op := startInProcessOperator(b, ctx, ns, copts, registration.BrokerConfig{URL: broker.URL(), Backend: backend, CardSigning: signer}, others)
		return withMosquitto{op, broker}, broker.Addr()
	}
}

// startEmbeddedOperator starts the operator with the embedded broker, in a child process or in
// this one with FLEET_OPERATOR_IN_PROCESS; it returns the operator and the broker's address.
func startEmbeddedOperator(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options) (fleetOperator, string) {
	if os.Getenv("FLEET_OPERATOR_IN_PROCESS") == "" {
		c := startChildOperator(b, ctx, cp.Config, ns, copts.MaxConcurrentReconciles, false)
		return c, c.brokerAddr
	}
	var others collateralCounter
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", Store: embedded.StoreConfig{OnKick: others.observe}})
	if err != nil {
		b.Fatalf("start embedded broker: %v", err)
	}
	b.Cleanup(func() { _ = srv.Close() })
	return startInProcessOperator(b, ctx, ns, copts, registration.BrokerConfig{URL: srv.URL(), Backend: srv.Backend()}, &others), srv.Addr()
}

// startInProcessOperator runs the operator in the test process, as cmd/manager does, on the
// broker of bc.
func startInProcessOperator(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options, bc registration.BrokerConfig, others *collateralCounter) fleetOperator {
	cfg := rest.CopyConfig(cp.Config)
	writes := operatorClientConfig(cfg)
	cp.StartOperatorWith(b, ctx, testenv.Operator{Config: cfg, Namespaces: ns, Broker: bc, Controllers: copts})
	return inProcessOperator{operatorCounters{backend: bc.Backend, others: others, writes: writes}}
}

// BenchmarkFleetRegistration runs the fleet on Mosquitto 2.0.11 with dynsec (the operator in the
// test process).
func BenchmarkFleetRegistration(b *testing.B) {
	for _, n := range fleetSizes("MOSQUITTO_FLEET_SIZES", "1000,3000") {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				broker := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
				user, pass := broker.DynSecAdmin()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				// Without CountKicks the backend names client-level kicks only (group-level ones
				// would cost a getGroup each); the witnesses see every kick anyway.
				var others collateralCounter
				backend, err := dynsec.Connect(ctx, dynsec.Config{URL: broker.URL(), Username: user, Password: pass, Logger: quiet, Timeout: time.Minute, OnKick: others.observe})
				cancel()
				if err != nil {
					b.Fatalf("connect dynsec: %v", err)
				}
				runFleetBenchmark(b, n, "mosquitto", func(b *testing.B, ctx context.Context, ns map[string]string, copts controllers.Options) (fleetOperator, string) {
					op := startInProcessOperator(b, ctx, ns, copts, registration.BrokerConfig{URL: broker.URL(), Backend: backend}, &others)
					return withMosquitto{op, broker}, broker.Addr()
				})
				_ = backend.Close(context.Background())
				broker.Kill()
			}
		})
	}
}

// BenchmarkFleetRegistrationTable runs the fleet on Mosquitto 2.0.11 with the project's
// decision-table plugin (internal/mqtt/mosqtable; the operator in the test process): the same
// fleet as BenchmarkFleetRegistration, whose dynsec time grows as n², at the sizes of the
// embedded broker (TABLE_FLEET_SIZES, default 1000,10000).
func BenchmarkFleetRegistrationTable(b *testing.B) {
	for _, n := range fleetSizes("TABLE_FLEET_SIZES", "1000,10000") {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				runFleetBenchmark(b, n, "table", startTableOperator(false))
			}
		})
	}
}

func fleetSizes(env, def string) []int {
	raw := os.Getenv(env)
	if raw == "" {
		raw = os.Getenv("FLEET_AGENTS")
	}
	if raw == "" {
		raw = def
	}
	var out []int
	for _, f := range strings.Split(raw, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// benchAgent is agent i of the benchmark fleet: 2 orgs × 10 units, a third of each caller scope,
// teams of 10 (label), and 1 % of the agents with a selector rule admitting another team. Each
// org lives in its own namespace (namespaces maps org → namespace), bound to it by a Tenant.
func benchAgent(namespaces map[string]string, i int) *a2av1.Agent {
	a := &a2av1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespaces[fmt.Sprintf("org%d", i%2)], Name: fmt.Sprintf("a%05d", i), Labels: map[string]string{"team": strconv.Itoa(i / 10)}},
		Spec: a2av1.AgentSpec{
			OrgID: fmt.Sprintf("org%d", i%2), UnitID: fmt.Sprintf("unit%d", i%10),
			Card: a2av1.AgentCardSpec{Name: "bench", Description: "benchmark agent"},
			Callers: a2av1.CallersSpec{Scope: []a2av1.CallerScope{
				a2av1.CallerScopeNone, a2av1.CallerScopeSameUnit, a2av1.CallerScopeSameOrg,
			}[i%3]},
		},
	}
	if i%100 == 0 {
		// A rule admits one other team of 10: rules select bounded sets, as teams do.
		a.Spec.Callers.From = []a2av1.CallerSelector{{AgentSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": strconv.Itoa(i/10 + 1)}}}}
	}
	return a
}

// fleetRow is one line of the benchmark table.
type fleetRow struct {
	broker                     string
	agents, witnesses          int
	elapsed                    time.Duration
	peakRSS, heap              float64
	cmds, trips, reads         float64
	writes                     float64
	writesBy                   map[string]int
	collateral, backendKicks   int
	load                       string
	brokerClients, aclsPerAgnt float64
	apiReads                   map[string]int // the operator's GETs and LISTs by resource (no watches)
	cpu                        cpuSample      // CPU seconds of the run, by process
	brokerCPU                  float64        // CPU seconds of the broker's own process (Mosquitto; 0 when it lives in the operator's)
	brokerSeparate             bool           // the broker ran in a process of its own
	controllers                map[string]controllerStats
	separate                   bool // the operator ran in a process of its own
}

// describeCPU is the run's CPU by process.
func (r fleetRow) describeCPU(elapsed time.Duration) string {
	procs := fmt.Sprintf("operator process (operator and embedded broker) %.1f s, benchmark process %.1f s", r.cpu.operator, r.cpu.self)
	if !r.separate {
		procs = fmt.Sprintf("test process (operator, broker runtime, benchmark) %.1f s", r.cpu.self)
	}
	if r.brokerSeparate {
		procs += fmt.Sprintf(", Mosquitto %.1f s", r.brokerCPU)
	}
	return fmt.Sprintf("CPU over %.1f s: %s, kube-apiserver %.1f s, etcd %.1f s (%.2f cores of 2)",
		elapsed.Seconds(), procs, r.cpu.apiserver, r.cpu.etcd, r.cpuTotal()/elapsed.Seconds())
}

// cpuTotal is the CPU seconds of every process of the run, the broker's own process included.
func (r fleetRow) cpuTotal() float64 { return r.cpu.total(r.separate) + r.brokerCPU }

// runFleetBenchmark applies a fleet of n Agents, reports its metrics and returns its row.
func runFleetBenchmark(b *testing.B, n int, brokerName string, startOperator operatorStarter) fleetRow {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	debug.FreeOSMemory()
	resetPeakRSS()

	var copts controllers.Options
	if v, err := strconv.Atoi(os.Getenv("FLEET_MAX_CONCURRENT")); err == nil {
		copts.MaxConcurrentReconciles = v // default: the operator's own default
	}
	ns := map[string]string{}
	for _, org := range []string{"org0", "org1"} {
		ns[org] = cp.NewNamespace(b, ctx, "bench-")
		cp.BindNamespace(b, ctx, ns[org], org)
		// A fleet of this size is beyond the default limits.maxAgents (1000 per Tenant).
		raise := fmt.Appendf(nil, `{"spec":{"limits":{"maxAgents":%d}}}`, n)
		if err := k8s.Patch(ctx, &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "testenv-" + ns[org]}}, client.RawPatch(types.MergePatchType, raise)); err != nil {
			b.Fatalf("raise the Tenant's maxAgents: %v", err)
		}
	}
	op, brokerAddr := startOperator(b, ctx, ns, copts)
	tracker := trackReady(b, ctx, ns)

	// Witnesses: agents of every org, unit and scope, connected before the rest is applied.
	w := min(20, n/50)
	var witnesses []*brokertest.Client
	if w > 0 {
		createFleet(b, ctx, ns, 0, w)
		tracker.wait(b, ctx, w)
		for i := range w {
			a := benchAgent(ns, i)
			s := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: identity.CredentialsSecretName(a)}, s); err != nil {
				b.Fatalf("witness secret: %v", err)
			}
			id := identity.Of(a)
			c := brokertest.MustDial(b, brokerAddr, brokertest.Options{Username: identity.Username(id), Password: string(s.Data["password"]), ClientID: id.ClientID()})
			if code := c.Subscribe(id.RequestTopic()); code >= 0x80 {
				b.Fatalf("witness %s subscribe: %#x", id.ClientID(), code)
			}
			witnesses = append(witnesses, c)
		}
	}
	watch := brokertest.NewWatch(witnesses...)

	snap := func(observe bool) operatorSnapshot {
		s, err := op.snapshot(observe)
		if err != nil {
			b.Fatalf("operator counters: %v", err)
		}
		return s
	}
	before := snap(false)
	meter := newCPUMeter(cp.Config, op.pid())
	brokerPID := 0
	if p, ok := op.(brokerProcess); ok {
		brokerPID = p.brokerPID()
	}
	cpuBefore, brokerBefore := meter.sample(), cpuSeconds(brokerPID)
	waitSnap := func(s operatorSnapshot) waitSample {
		w := waitSample{at: time.Now(), cpu: readCPUTimes(), pressure: readPressure(), delayOperator: runDelay(meter.operator),
			delayAPI: runDelay(meter.apiserver), delayEtcd: runDelay(meter.etcd), operatorAPI: s.API}
		w.apiserver, w.apiserverErr = scrapeAPIServer(cp.Config)
		return w
	}
	waitsBefore := waitSnap(before)
	profiled := profileAPIServer(b, ctx, fmt.Sprintf("apiserver-%s-%d.prof", brokerName, n))
	if dir := os.Getenv("FLEET_CPUPROFILE_DIR"); dir != "" {
		// The operator process's CPU over the timed part.
		if err := op.cpuProfile(filepath.Join(dir, fmt.Sprintf("operator-cpu-%s-%d.prof", brokerName, n))); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	stopProgress := logProgress(ctx, meter, tracker)
	createFleet(b, ctx, ns, w, n)
	created := time.Since(start)
	tracker.wait(b, ctx, n)
	elapsed := time.Since(start)
	stopProgress()
	cpuUsed, brokerUsed := meter.sample().minus(cpuBefore), cpuSeconds(brokerPID)-brokerBefore
	after := snap(false)
	waitsAfter := waitSnap(after)
	if os.Getenv("FLEET_CPUPROFILE_DIR") != "" {
		if err := op.cpuProfile(""); err != nil {
			b.Fatal(err)
		}
	}
	memory := describeMemory(meter, float64(n))
	<-profiled
	kicked := watch.Kicked()
	peakRSS := op.peakRSSMiB()
	if dir := os.Getenv("FLEET_HEAPPROFILE_DIR"); dir != "" {
		// What is live with the whole fleet Ready (the test's -memprofile only sees the end).
		if err := op.writeHeapProfile(filepath.Join(dir, fmt.Sprintf("heap-%s-%d.prof", brokerName, n))); err != nil {
			b.Fatal(err)
		}
	}
	observed := snap(true)
	stats := after.Stats
	applied := float64(n - w)
	row := fleetRow{
		broker: brokerName, agents: n, witnesses: w, elapsed: elapsed,
		peakRSS: peakRSS, heap: float64(after.HeapInuse) / (1 << 20), separate: op.pid() != os.Getpid(),
		cmds:     float64(stats.Mutations-before.Stats.Mutations) / applied,
		trips:    float64(stats.RoundTrips-before.Stats.RoundTrips) / applied,
		reads:    float64(stats.Reads-before.Stats.Reads) / applied,
		writesBy: map[string]int{}, collateral: len(kicked),
		backendKicks: int(after.Kicks - before.Kicks),
		load:         hostload.Label(), brokerClients: float64(observed.Clients), aclsPerAgnt: float64(observed.ACLEntries) / float64(n),
		apiReads: map[string]int{}, cpu: cpuUsed, controllers: controllerDelta(before.Controllers, after.Controllers),
		brokerCPU: brokerUsed, brokerSeparate: brokerPID != 0,
	}
	for k, v := range after.Reads {
		if d := v - before.Reads[k]; d > 0 {
			row.apiReads[k] = d
		}
	}
	total := 0
	for k, v := range after.Writes {
		if d := v - before.Writes[k]; d > 0 {
			row.writesBy[k] = d
			total += d
		}
	}
	row.writes = float64(total) / applied

	b.ReportMetric(elapsed.Seconds(), "s-to-all-ready")
	b.ReportMetric(elapsed.Seconds()*1000/applied, "ms/agent")
	b.ReportMetric(row.peakRSS, "peak-RSS-MiB")
	b.ReportMetric(row.cmds, "broker-cmds/agent")
	b.ReportMetric(row.trips, "broker-roundtrips/agent")
	b.ReportMetric(row.writes, "apiserver-writes/agent")
	b.ReportMetric(float64(row.collateral), "collateral-kicks")
	b.ReportMetric(row.cpu.operator*1000/applied, "cpu-ms/agent-operator")
	if row.separate {
		b.ReportMetric(row.cpu.self*1000/applied, "cpu-ms/agent-benchmark")
	}
	b.ReportMetric(row.cpu.apiserver*1000/applied, "cpu-ms/agent-apiserver")
	b.ReportMetric(row.cpu.etcd*1000/applied, "cpu-ms/agent-etcd")
	if row.brokerSeparate {
		b.ReportMetric(row.brokerCPU*1000/applied, "cpu-ms/agent-mosquitto")
	}
	b.Logf("%s", row)
	b.Logf("%s", row.describeCPU(elapsed))
	b.Logf("controllers: %s", describeControllers(row.controllers, applied))
	agentCtl := row.controllers["agent"]
	workers := cmp.Or(copts.MaxConcurrentReconciles, controllers.DefaultMaxConcurrentReconciles)
	b.Logf("waits: the fleet was created in %.1f s (%d writers); the Agent controller's %d workers were busy %.0f %% of the run; %s",
		created.Seconds(), fleetWriters, workers, 100*agentCtl.ReconcileSeconds/(float64(workers)*elapsed.Seconds()),
		describeWaits(waitsBefore, waitsAfter, agentCtl.ReconcileSeconds, agentCtl.Reconciles, applied, row.cpuTotal()))
	b.Logf("operator reads per agent (cache misses and API reader): %s; memory with the fleet Ready: %s", perAgent(row.apiReads, applied), memory)
	if len(kicked) > 0 {
		b.Errorf("collateral kicks: applying the fleet disconnected witness agents %v", kicked)
	}
	return row
}

func (r fleetRow) String() string {
	var by []string
	for k, v := range r.writesBy {
		by = append(by, fmt.Sprintf("%s=%.2f", k, float64(v)/float64(r.agents-r.witnesses)))
	}
	slices.Sort(by)
	return fmt.Sprintf("| %s | %d | %.1f s | %.2f ms | %.0f MiB (heap %.0f) | %.2f | %.2f | %.2f | %.2f (%s) | %d of %d witnesses (backend: %d) | %.1f ACLs | %s |",
		r.broker, r.agents, r.elapsed.Seconds(), r.elapsed.Seconds()*1000/float64(r.agents-r.witnesses), r.peakRSS, r.heap,
		r.cmds, r.trips, r.reads, r.writes, strings.Join(by, " "), r.collateral, r.witnesses, r.backendKicks, r.aclsPerAgnt, r.load)
}

// fleetWriters is how many Agents the benchmark creates at once (a kubectl apply of a fleet,
// or several).
const fleetWriters = 8

// createFleet creates agents [from, to) with fleetWriters parallel writers.
func createFleet(b *testing.B, ctx context.Context, ns map[string]string, from, to int) {
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := range fleetWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from + w; i < to; i += fleetWriters {
				if err := k8s.Create(ctx, benchAgent(ns, i)); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		b.Fatalf("create agent: %v", err)
	}
}

// readyTracker counts Ready Agents from a watch (an informer), instead of listing the whole
// fleet again and again.
type readyTracker struct {
	mu    sync.Mutex
	ready map[string]bool
	count int
	moved chan struct{}
}

func trackReady(b *testing.B, ctx context.Context, namespaces map[string]string) *readyTracker {
	t := &readyTracker{ready: map[string]bool{}, moved: make(chan struct{}, 1)}
	scope := map[string]cache.Config{}
	for _, ns := range namespaces {
		scope[ns] = cache.Config{}
	}
	// The benchmark's own copy keeps only what it counts (name and Ready), so that the process's
	// RSS is the operator's and the broker's, not a second cache of the fleet.
	c, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme, DefaultNamespaces: scope,
		DefaultTransform: readyOnly})
	if err != nil {
		b.Fatalf("cache: %v", err)
	}
	inf, err := c.GetInformer(ctx, &a2av1.Agent{})
	if err != nil {
		b.Fatalf("informer: %v", err)
	}
	update := func(obj any) {
		a, ok := obj.(*a2av1.Agent)
		if !ok {
			return
		}
		r := meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady)
		t.mu.Lock()
		if key := a.Namespace + "/" + a.Name; t.ready[key] != r {
			t.ready[key] = r
			if r {
				t.count++
			} else {
				t.count--
			}
		}
		t.mu.Unlock()
		select {
		case t.moved <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: update, UpdateFunc: func(_, o any) { update(o) }}); err != nil {
		b.Fatalf("handler: %v", err)
	}
	cctx, stop := context.WithCancel(ctx)
	b.Cleanup(stop)
	go func() { _ = c.Start(cctx) }()
	if !c.WaitForCacheSync(ctx) {
		b.Fatal("cache did not sync")
	}
	return t
}

// readyOnly reduces a watched Agent to its name and its Ready condition.
func readyOnly(obj any) (any, error) {
	a, ok := obj.(*a2av1.Agent)
	if !ok {
		return obj, nil
	}
	slim := &a2av1.Agent{TypeMeta: a.TypeMeta}
	slim.Namespace, slim.Name, slim.ResourceVersion = a.Namespace, a.Name, a.ResourceVersion
	if c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionReady); c != nil {
		slim.Status.Conditions = []metav1.Condition{{Type: c.Type, Status: c.Status}}
	}
	return slim, nil
}

// ready is the number of Agents Ready now.
func (t *readyTracker) readyCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count
}

// logProgress, with FLEET_PROGRESS set, logs every 10 s how many Agents became Ready and the CPU
// each process spent per Agent in that interval: where a rollout slows down, and who pays for it.
func logProgress(ctx context.Context, meter cpuMeter, t *readyTracker) (stop func()) {
	if os.Getenv("FLEET_PROGRESS") == "" {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		start, lastCPU, lastReady := time.Now(), meter.sample(), t.readyCount()
		for {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
			cpu, ready := meter.sample(), t.readyCount()
			d, k := cpu.minus(lastCPU), float64(max(ready-lastReady, 1))
			// Not b.Logf: the testing package keeps only a benchmark's first 10 log lines.
			fmt.Fprintf(os.Stderr, "fleet progress %3.0f s: %d Ready (+%d); CPU ms per new Ready: operator %.1f, benchmark %.1f, kube-apiserver %.1f, etcd %.1f; operator RSS %.0f MiB\n",
				time.Since(start).Seconds(), ready, ready-lastReady, d.operator*1000/k, d.self*1000/k, d.apiserver*1000/k, d.etcd*1000/k, rssMiB(meter.operator))
			lastCPU, lastReady = cpu, ready
		}
	}()
	return func() { cancel(); <-done }
}

func (t *readyTracker) wait(b *testing.B, ctx context.Context, n int) {
	for {
		t.mu.Lock()
		c := t.count
		t.mu.Unlock()
		if c >= n {
			return
		}
		select {
		case <-t.moved:
		case <-ctx.Done():
			b.Fatalf("only %d/%d agents Ready: %v", c, n, ctx.Err())
		}
	}
}

// operatorClientConfig makes cfg the operator's client config in a fleet run: no client-side
// rate limit (the operator's default would be what is measured), its requests counted.
func operatorClientConfig(cfg *rest.Config) *writeCounter {
	cfg.QPS, cfg.Burst = -1, 0
	writes := &writeCounter{by: map[string]int{}}
	cfg.Wrap(writes.wrap)
	return writes
}

// writeCounter counts the operator's requests to the apiserver by resource: writes, and reads
// other than watches.
type writeCounter struct {
	mu    sync.Mutex
	by    map[string]int
	reads map[string]int
	// timed are the requests other than watches and the time each kind took, from the request
	// until its response's headers (what the caller waits for).
	timed map[string]apiTiming
	// refused are the writes the apiserver refused because the operator's informer lagged: 409
	// (a stale resourceVersion: it had not yet seen the object's last change; the reconcile
	// retries) and 404 (the object is gone: a reconcile queued before it went, which ignores it).
	refused map[string]int
}

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		key := req.Method + " " + resourceOf(req.URL.Path)
		watch := req.URL.Query().Get("watch") == "true"
		switch {
		case req.Method != http.MethodGet:
			w.mu.Lock()
			w.by[key]++
			w.mu.Unlock()
		case !watch:
			w.mu.Lock()
			if w.reads == nil {
				w.reads = map[string]int{}
			}
			w.reads[key]++
			w.mu.Unlock()
		}
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		if err == nil && req.Method != http.MethodGet && (resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusNotFound) {
			w.mu.Lock()
			if w.refused == nil {
				w.refused = map[string]int{}
			}
			w.refused[key]++
			w.mu.Unlock()
		}
		if !watch {
			w.mu.Lock()
			if w.timed == nil {
				w.timed = map[string]apiTiming{}
			}
			t := w.timed[key]
			t.Count++
			t.Seconds += time.Since(start).Seconds()
			w.timed[key] = t
			w.mu.Unlock()
		}
		return resp, err
	})
}

func (w *writeCounter) snapshotTimed() map[string]apiTiming {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.timed)
}

func (w *writeCounter) snapshotRefused() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.refused)
}

func (w *writeCounter) snapshotReads() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.reads)
}

func perAgent(m map[string]int, agents float64) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s=%.2f", k, float64(m[k])/agents))
	}
	return strings.Join(out, " ")
}

func (w *writeCounter) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.by))
	for k, v := range w.by {
		out[k] = v
	}
	return out
}

// resourceOf turns /apis/g/v/namespaces/ns/agents/name/status into "agents/status".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			res := parts[i+2]
			if len(parts) > i+4 {
				res += "/" + parts[i+4]
			}
			return res
		}
	}
	return path
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// peakRSSMiB is process pid's high-water resident set (VmHWM) since resetPeakRSS.
func peakRSSMiB(pid int) float64 { return procStatusMiB(pid, "VmHWM:") }

// rssMiB is process pid's resident set now.
func rssMiB(pid int) float64 { return procStatusMiB(pid, "VmRSS:") }

// procStatusMiB reads a size field of /proc/<pid>/status.
func procStatusMiB(pid int, field string) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// resetPeakRSS restarts VmHWM from the current RSS (Linux: "5" to clear_refs), so each fleet
// size reports its own peak.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// profileAPIServer fetches a CPU profile of kube-apiserver (its /debug/pprof) for
// FLEET_APISERVER_PROFILE_SECONDS of the fleet, starting FLEET_APISERVER_PROFILE_DELAY (a Go
// duration, default 0) after it, into FLEET_HEAPPROFILE_DIR; the channel closes
// when it is written (at once when not asked for).
func profileAPIServer(b *testing.B, ctx context.Context, name string) <-chan struct{} {
	done := make(chan struct{})
	secs, dir := os.Getenv("FLEET_APISERVER_PROFILE_SECONDS"), os.Getenv("FLEET_HEAPPROFILE_DIR")
	if secs == "" || dir == "" {
		close(done)
		return done
	}
	hc, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		b.Fatalf("apiserver profile: %v", err)
	}
	delay, _ := time.ParseDuration(os.Getenv("FLEET_APISERVER_PROFILE_DELAY"))
	go func() {
		defer close(done)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cp.Config.Host, "/")+"/debug/pprof/profile?seconds="+secs, nil)
		if err != nil {
			b.Errorf("apiserver profile: %v", err)
			return
		}
		resp, err := hc.Do(req)
		if err != nil {
			b.Errorf("apiserver profile: %v", err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			b.Errorf("apiserver profile: %v", err)
			return
		}
		defer f.Close()
		if _, err := io.Copy(f, resp.Body); err != nil {
			b.Errorf("apiserver profile: %v", err)
		}
	}()
	return done
}

// writeHeapProfileTo writes this process's live heap (after a GC) to path.
func writeHeapProfileTo(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}
