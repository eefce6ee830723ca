package registration_test

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Where the wall time of a fleet goes, measured beside it: CPU seconds of each process involved
// (this process, kube-apiserver, etcd), reconciles and workqueue waits per controller.

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat (100 on Linux).
const clockTicks = 100

// cpuSeconds is the user+system CPU time of process pid so far (0 when it cannot be read).
func cpuSeconds(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: fields count from after its closing ')'.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / clockTicks
}

// controlPlanePIDs finds the kube-apiserver serving cfg and the etcd it uses, by their command
// lines (envtest's processes are not necessarily our children).
func controlPlanePIDs(cfg *rest.Config) (apiserver, etcd int) {
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return 0, 0
	}
	port := u.Port()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	cmdlines := map[int][]string{}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		cmdlines[pid] = strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	}
	var etcdURL string
	for pid, args := range cmdlines {
		if filepath.Base(args[0]) != "kube-apiserver" || !slices.Contains(args, "--secure-port="+port) {
			continue
		}
		apiserver = pid
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--etcd-servers="); ok {
				etcdURL = v
			}
		}
	}
	if etcdURL == "" {
		return apiserver, 0
	}
	for pid, args := range cmdlines {
		if filepath.Base(args[0]) != "etcd" {
			continue
		}
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--listen-client-urls="); ok && strings.Contains(v, etcdURL) {
				etcd = pid
			}
		}
	}
	return apiserver, etcd
}

// cpuMeter reads the CPU time of the processes of a run: this one, the operator's (this one
// when it runs in-process), kube-apiserver and etcd.
type cpuMeter struct{ self, operator, apiserver, etcd int }

type cpuSample struct{ self, operator, apiserver, etcd float64 }

func newCPUMeter(cfg *rest.Config, operator int) cpuMeter {
	a, e := controlPlanePIDs(cfg)
	return cpuMeter{self: os.Getpid(), operator: operator, apiserver: a, etcd: e}
}

func (m cpuMeter) sample() cpuSample {
	return cpuSample{self: cpuSeconds(m.self), operator: cpuSeconds(m.operator), apiserver: cpuSeconds(m.apiserver), etcd: cpuSeconds(m.etcd)}
}

// total is the CPU of every process of the run (the operator's counted once: separate says it
// runs in a process of its own).
func (s cpuSample) total(separate bool) float64 {
	t := s.self + s.apiserver + s.etcd
	if separate {
		t += s.operator
	}
	return t
}

func (s cpuSample) minus(o cpuSample) cpuSample {
	return cpuSample{self: s.self - o.self, operator: s.operator - o.operator, apiserver: s.apiserver - o.apiserver, etcd: s.etcd - o.etcd}
}

// controllerStats are controller-runtime's own metrics (its global registry) for one controller.
type controllerStats struct {
	Reconciles, Errors  float64
	ReconcileSeconds    float64 // sum of reconcile durations
	QueueWaits, WaitSum float64 // workqueue: items taken and the sum of their waits
}

// controllerMetrics gathers controller-runtime's registry by controller name.
func controllerMetrics() map[string]controllerStats {
	out := map[string]controllerStats{}
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return out
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "controller_runtime_reconcile_total":
				c := label(m, "controller")
				s := out[c]
				s.Reconciles += m.GetCounter().GetValue()
				if label(m, "result") == "error" {
					s.Errors += m.GetCounter().GetValue()
				}
				out[c] = s
			case "controller_runtime_reconcile_time_seconds":
				c := label(m, "controller")
				s := out[c]
				s.ReconcileSeconds += m.GetHistogram().GetSampleSum()
				out[c] = s
			case "workqueue_queue_duration_seconds":
				c := label(m, "name")
				s := out[c]
				s.QueueWaits += float64(m.GetHistogram().GetSampleCount())
				s.WaitSum += m.GetHistogram().GetSampleSum()
				out[c] = s
			}
		}
	}
	return out
}

// controllerDelta is after minus before, per controller.
func controllerDelta(before, after map[string]controllerStats) map[string]controllerStats {
	out := map[string]controllerStats{}
	for c, a := range after {
		b := before[c]
		d := controllerStats{
			Reconciles: a.Reconciles - b.Reconciles, Errors: a.Errors - b.Errors,
			ReconcileSeconds: a.ReconcileSeconds - b.ReconcileSeconds,
			QueueWaits:       a.QueueWaits - b.QueueWaits, WaitSum: a.WaitSum - b.WaitSum,
		}
		if d.Reconciles > 0 || d.QueueWaits > 0 {
			out[c] = d
		}
	}
	return out
}

// describeControllers is one line per controller: reconciles per Agent, mean reconcile time, mean
// workqueue wait.
func describeControllers(d map[string]controllerStats, agents float64) string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(d)) {
		s := d[c]
		meanRec, meanWait := 0.0, 0.0
		if s.Reconciles > 0 {
			meanRec = s.ReconcileSeconds / s.Reconciles * 1000
		}
		if s.QueueWaits > 0 {
			meanWait = s.WaitSum / s.QueueWaits * 1000
		}
		parts = append(parts, fmt.Sprintf("%s: %.2f reconciles/agent (%.0f errors), %.1f ms each, %.1f ms queued, %.0f s busy",
			c, s.Reconciles/agents, s.Errors, meanRec, meanWait, s.ReconcileSeconds))
	}
	return strings.Join(parts, "; ")
}
