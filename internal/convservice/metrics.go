package convservice

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the service's Prometheus instruments, registered on a
// registry owned by the Service (no process-global state, so several
// services can run in one test process).
type metrics struct {
	activeContexts *prometheus.GaugeVec
	tasks          *prometheus.GaugeVec
	requests       *prometheus.CounterVec
	rejections     *prometheus.CounterVec
	replies        *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	durable        *prometheus.HistogramVec
	// durableRequest and durableReply are durable's two series, resolved
	// once: observed on every request and final reply.
	durableRequest, durableReply prometheus.Observer
	gatedAgents                  prometheus.Gauge
	historyItems                 prometheus.Gauge
	historyBytes                 prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		activeContexts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "a2a_conversation", Name: "active_contexts",
			Help: "Unexpired conversation contexts per gated agent (refreshed by the stats loop).",
		}, []string{"agent"}),
		tasks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "a2a_conversation", Name: "tasks",
			Help: "Tasks held in conversation history by state (refreshed by the stats loop).",
		}, []string{"state"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "a2a_conversation", Name: "requests_total",
			Help: "Requests handled by decision kind (new_context, new_task, resume, retry, reject, ...).",
		}, []string{"kind"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "a2a_conversation", Name: "rejections_total",
			Help: "Requests answered with an error instead of being forwarded, by reason.",
		}, []string{"reason"}),
		replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "a2a_conversation", Name: "replies_total",
			Help: "Agent replies by outcome: relayed (PUBACK success), relayed_unread (PUBACK: no subscriber), relayed_unconfirmed (pipelined stream item, no PUBACK awaited), relay_refused (PUBACK error), relay_failed, dropped_unsealed, dropped_replay (a reply on a route that already ended), internal, task_presented_again (a first answer showed the agent takes task ids the other way; not relayed).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "a2a_conversation", Name: "proxy_latency_seconds",
			Help:    "Time the proxy adds: request received to forwarded (path=request), reply received to relayed (path=reply).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"path"}),
		durable: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "a2a_conversation", Name: "durable_wait_seconds",
			Help:    "The storage part of proxy_latency_seconds: decision to durable before a request is forwarded (path=request), final event to durable before it is relayed (path=reply).",
			Buckets: []float64{.00005, .0001, .00015, .0002, .0003, .0005, .001, .002, .005, .01, .05, .25, 1},
		}, []string{"path"}),
		gatedAgents: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "a2a_conversation", Name: "gated_agents",
			Help: "Agents whose public request topic this replica consumes.",
		}),
		historyItems: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "a2a_conversation", Name: "history_items",
			Help: "Messages and artifacts held as history content (policy history mode Messages; refreshed by the stats loop).",
		}),
		historyBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "a2a_conversation", Name: "history_bytes",
			Help: "Bytes of message and artifact content held as history (A2A v1.0 JSON; each context bounded by its policy's maxBytesPerContext).",
		}),
	}
	m.durableRequest, m.durableReply = m.durable.WithLabelValues("request"), m.durable.WithLabelValues("reply")
	reg.MustRegister(m.activeContexts, m.tasks, m.requests, m.rejections, m.replies, m.latency, m.durable, m.gatedAgents, m.historyItems, m.historyBytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
