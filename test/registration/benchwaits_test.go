package registration_test

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// What a fleet's reconciles waited on, so that a slow run explains itself: the machine (CPU and
// I/O pressure, each process's time runnable but waiting for a core), the operator's API round
// trips as it timed them, and kube-apiserver's own account of its requests (priority-and-fairness
// queueing, etcd).

// pressure is /proc/pressure/<resource>'s "some" and "full" totals (µs): the time at least one
// task (some), or every task (full), was stalled on the resource.
type pressure struct{ someCPU, someIO, fullIO float64 }

func readPressure() pressure {
	read := func(resource, kind string) float64 {
		raw, err := os.ReadFile("/proc/pressure/" + resource)
		if err != nil {
			return 0
		}
		for _, line := range strings.Split(string(raw), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != kind {
				continue
			}
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, "total="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					return n
				}
			}
		}
		return 0
	}
	return pressure{someCPU: read("cpu", "some"), someIO: read("io", "some"), fullIO: read("io", "full")}
}

func (p pressure) minus(o pressure) pressure {
	return pressure{someCPU: p.someCPU - o.someCPU, someIO: p.someIO - o.someIO, fullIO: p.fullIO - o.fullIO}
}

// cpuTimes is the machine's CPU time (/proc/stat's cpu line, seconds over all cores) by state.
type cpuTimes struct{ busy, idle, iowait, steal float64 }

func readCPUTimes() cpuTimes {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}
	}
	v := make([]float64, len(f))
	for i := 1; i < len(f); i++ {
		v[i], _ = strconv.ParseFloat(f[i], 64)
		v[i] /= clockTicks
	}
	// user nice system idle iowait irq softirq steal ...
	return cpuTimes{busy: v[1] + v[2] + v[3] + v[6] + v[7], idle: v[4], iowait: v[5], steal: v[8]}
}

func (c cpuTimes) minus(o cpuTimes) cpuTimes {
	return cpuTimes{busy: c.busy - o.busy, idle: c.idle - o.idle, iowait: c.iowait - o.iowait, steal: c.steal - o.steal}
}

// runDelay is the time process pid's threads spent runnable but waiting for a core, in seconds
// (the second field of /proc/<pid>/task/*/schedstat; threads that exited are not counted).
func runDelay(pid int) float64 {
	if pid == 0 {
		return 0
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	total := 0.0
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(raw)); len(f) >= 2 {
			ns, _ := strconv.ParseFloat(f[1], 64)
			total += ns / 1e9
		}
	}
	return total
}

// waitSample is the machine's and the processes' waiting at one moment.
type waitSample struct {
	at                                 time.Time
	cpu                                cpuTimes
	pressure                           pressure
	delayOperator, delayAPI, delayEtcd float64
	apiserver                          apiserverStats
	apiserverErr                       error
	operatorAPI                        map[string]apiTiming
}

// apiserverStats are sums of kube-apiserver's own request histograms (all clients).
type apiserverStats struct {
	requests, requestSeconds float64 // apiserver_request_duration_seconds (non-watch)
	apfWaits, apfWaitSeconds float64 // apiserver_flowcontrol_request_wait_duration_seconds
	etcdOps, etcdSeconds     float64 // etcd_request_duration_seconds
	inflightMax              float64 // apiserver_current_inflight_requests, the sum of its gauges now
}

// scrapeAPIServer reads kube-apiserver's /metrics (admin credentials).
func scrapeAPIServer(cfg *rest.Config) (apiserverStats, error) {
	var s apiserverStats
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return s, err
	}
	resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("kube-apiserver /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, m := range families["apiserver_request_duration_seconds"].GetMetric() {
		if label(m, "verb") == "WATCH" || label(m, "verb") == "CONNECT" {
			continue
		}
		s.requests += float64(m.GetHistogram().GetSampleCount())
		s.requestSeconds += m.GetHistogram().GetSampleSum()
	}
	for _, m := range families["apiserver_flowcontrol_request_wait_duration_seconds"].GetMetric() {
		s.apfWaits += float64(m.GetHistogram().GetSampleCount())
		s.apfWaitSeconds += m.GetHistogram().GetSampleSum()
	}
	for _, m := range families["etcd_request_duration_seconds"].GetMetric() {
		s.etcdOps += float64(m.GetHistogram().GetSampleCount())
		s.etcdSeconds += m.GetHistogram().GetSampleSum()
	}
	for _, m := range families["apiserver_current_inflight_requests"].GetMetric() {
		s.inflightMax += m.GetGauge().GetValue()
	}
	return s, nil
}

// apiTiming is the operator's requests of one kind (verb and resource) and the time they took
// as its client saw them.
type apiTiming struct {
	Count   int
	Seconds float64
}

// describeWaits says where a run's reconcile time went and what the machine waited on between
// two samples; agents is the number applied.
// ours is the CPU the run's own processes (operator, benchmark, kube-apiserver, etcd) used
// between the samples, in seconds.
func describeWaits(before, after waitSample, reconcileSeconds, reconciles, agents, ours float64) string {
	wall := after.at.Sub(before.at).Seconds()
	var b strings.Builder
	// The reconciles: their API round trips (as the operator's client timed them) and the rest.
	api := map[string]apiTiming{}
	var apiSeconds float64
	var apiCount int
	for k, v := range after.operatorAPI {
		d := apiTiming{Count: v.Count - before.operatorAPI[k].Count, Seconds: v.Seconds - before.operatorAPI[k].Seconds}
		if d.Count > 0 {
			api[k] = d
			apiSeconds += d.Seconds
			apiCount += d.Count
		}
	}
	fmt.Fprintf(&b, "reconcile time: the Agent controller's workers were busy %.0f s (%.1f reconciles/agent, %.1f ms each)", reconcileSeconds, reconciles/agents, 1000*reconcileSeconds/max(reconciles, 1))
	if apiCount > 0 {
		fmt.Fprintf(&b, "; the operator's API round trips took %.0f s (%.0f %%) over %d requests (%.2f per agent, %.1f ms each:", apiSeconds, 100*apiSeconds/max(reconcileSeconds, 1e-9), apiCount, float64(apiCount)/agents, 1000*apiSeconds/float64(apiCount))
		for _, k := range slices.Sorted(maps.Keys(api)) {
			fmt.Fprintf(&b, " %s %.1f ms ×%.2f", k, 1000*api[k].Seconds/float64(api[k].Count), float64(api[k].Count)/agents)
		}
		fmt.Fprintf(&b, "); the rest, %.0f s, is the operator's own work (CPU, the broker, locks)", max(reconcileSeconds-apiSeconds, 0))
	}
	// kube-apiserver's account of all its requests.
	if after.apiserverErr == nil && before.apiserverErr == nil {
		a, z := after.apiserver, before.apiserver
		n := a.requests - z.requests
		if n > 0 {
			fmt.Fprintf(&b, "; kube-apiserver served %.0f requests (all clients), %.1f ms each, of which queued by priority and fairness %.2f ms, in etcd %.1f ms (%.1f etcd calls per request)",
				n, 1000*(a.requestSeconds-z.requestSeconds)/n, 1000*(a.apfWaitSeconds-z.apfWaitSeconds)/n, 1000*(a.etcdSeconds-z.etcdSeconds)/n, (a.etcdOps-z.etcdOps)/n)
		}
	} else {
		fmt.Fprintf(&b, "; kube-apiserver metrics unavailable: %v %v", before.apiserverErr, after.apiserverErr)
	}
	// The machine: who had its cores, and who waited for them.
	c := after.cpu.minus(before.cpu)
	if total := c.busy + c.idle + c.iowait + c.steal; total > 0 {
		fmt.Fprintf(&b, "; the machine's cores: this run's processes %.0f %%, other processes %.0f %%, idle %.0f %%, I/O wait %.0f %%, taken by the hypervisor (steal) %.0f %%",
			100*ours/total, 100*max(c.busy-ours, 0)/total, 100*c.idle/total, 100*c.iowait/total, 100*c.steal/total)
	}
	p := after.pressure.minus(before.pressure)
	fmt.Fprintf(&b, "; over %.1f s: some task waiting for a core %.0f %% of the time, for I/O %.0f %% (every task %.0f %%); time runnable but not running: operator %.1f s, kube-apiserver %.1f s, etcd %.1f s",
		wall, p.someCPU/1e4/wall, p.someIO/1e4/wall, p.fullIO/1e4/wall,
		after.delayOperator-before.delayOperator, after.delayAPI-before.delayAPI, after.delayEtcd-before.delayEtcd)
	return b.String()
}

// describeMemory is the resident memory of the operator, kube-apiserver and etcd now, in all and
// per Agent of the n in the cluster (the fleet's cost to each, beside its fixed size).
func describeMemory(m cpuMeter, n float64) string {
	var parts []string
	for _, p := range []struct {
		name string
		pid  int
	}{{"operator", m.operator}, {"kube-apiserver", m.apiserver}, {"etcd", m.etcd}} {
		if p.pid == 0 {
			continue
		}
		rss := rssMiB(p.pid)
		parts = append(parts, fmt.Sprintf("%s RSS %.0f MiB (%.1f KiB per Agent)", p.name, rss, rss*1024/n))
	}
	return strings.Join(parts, ", ")
}
