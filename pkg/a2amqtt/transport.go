package a2amqtt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/google/uuid"
)

// TransportProtocolMQTT is the protocolBinding value of an MQTT interface in
// an agent card's supportedInterfaces. A2A allows custom bindings.
const TransportProtocolMQTT a2a.TransportProtocol = "MQTT"

// Transport is an a2aclient.Transport over the A2A over MQTT profile. It
// targets one agent (or one pool) through a shared Requester.
type Transport struct {
	r *Requester
	t target
	// onDestroy runs on Destroy (closes a Conn the transport owns).
	onDestroy func() error
}

var _ a2aclient.Transport = (*Transport)(nil)

// Transport returns a transport addressing agent directly.
func (r *Requester) Transport(agent AgentRef) *Transport {
	return &Transport{r: r, t: target{agent: agent}}
}

// PoolTransport returns a transport addressing a shared pool; follow-ups for
// a task go to the concrete responder named by a2a-responder-agent-id.
func (r *Requester) PoolTransport(pool PoolRef) *Transport {
	p := pool
	return &Transport{r: r, t: target{pool: &p}}
}

// Requester returns the requester behind the transport.
func (t *Transport) Requester() *Requester { return t.r }

// Target describes the addressee ("org/unit/agent" or "org/unit/pool/p").
func (t *Transport) Target() string { return t.t.String() }

// prepareSend fills in what the profile makes the requester responsible
// for: a UUIDv4 Task.id and context id, and a message id. The caller's
// request is not mutated.
func prepareSend(req *a2a.SendMessageRequest) (*a2a.SendMessageRequest, error) {
	if req == nil || req.Message == nil {
		return nil, fmt.Errorf("a2amqtt: message is required: %w", a2a.ErrInvalidParams)
	}
	cp := *req
	msg := *req.Message
	if msg.TaskID == "" {
		msg.TaskID = a2a.TaskID(uuid.NewString())
	}
	if msg.ContextID == "" {
		msg.ContextID = uuid.NewString()
	}
	if msg.ID == "" {
		msg.ID = uuid.NewString()
	}
	if msg.Role == "" {
		msg.Role = a2a.MessageRoleUser
	}
	cp.Message = &msg
	return &cp, nil
}

func (t *Transport) sendCall(method string, req *a2a.SendMessageRequest, stream bool) call {
	return call{target: t.t, method: method, params: req, taskID: req.Message.TaskID, contextID: req.Message.ContextID, stream: stream, events: true}
}

// SendMessage implements a2aclient.Transport. A responder may answer with one Task or Message
// (the method's result) or with a stream of status/artifact updates (the A2A-over-MQTT
// profile's user story; some SDKs stream for the unary method): the updates are folded into a
// Task until the stream-final one (EndsReplies).
func (t *Transport) SendMessage(ctx context.Context, params a2aclient.ServiceParams, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	req, err := prepareSend(req)
	if err != nil {
		return nil, err
	}
	c := t.sendCall(MethodSendMessage, req, false)
	fold := sendMessageFold{req: req, first: true}
	err = t.r.doParams(ctx, c, params, func(rep *reply) (bool, error) {
		return fold.add(rep.event), nil
	})
	if err != nil {
		return nil, err
	}
	return fold.result, nil
}

// sendMessageFold folds SendMessage's replies into its result: one Task or Message, or a
// stream of updates folded into a Task until the stream-final one (EndsReplies).
type sendMessageFold struct {
	req    *a2a.SendMessageRequest
	result a2a.SendMessageResult
	folded *a2a.Task
	first  bool
}

// add takes one reply and reports whether it ends the call.
func (f *sendMessageFold) add(ev a2a.Event) bool {
	final := EndsReplies(MethodSendMessage, replyItemOf(ev, f.first))
	f.first = false
	switch v := ev.(type) {
	case *a2a.Message:
		f.result = v
	case *a2a.Task:
		// The result, or a snapshot the updates after it apply to.
		f.folded = v
		f.result = f.folded
	default:
		f.folded = foldEvent(f.folded, f.req, ev)
		f.result = f.folded
	}
	return final
}

// foldEvent applies a status/artifact update to a task snapshot.
func foldEvent(task *a2a.Task, req *a2a.SendMessageRequest, ev a2a.Event) *a2a.Task {
	if task == nil {
		task = &a2a.Task{ID: req.Message.TaskID, ContextID: req.Message.ContextID, History: []*a2a.Message{req.Message}}
	}
	switch v := ev.(type) {
	case *a2a.TaskStatusUpdateEvent:
		task.Status = v.Status
		if v.ContextID != "" {
			task.ContextID = v.ContextID
		}
	case *a2a.TaskArtifactUpdateEvent:
		if v.Artifact == nil {
			break
		}
		i := slices.IndexFunc(task.Artifacts, func(a *a2a.Artifact) bool { return a.ID == v.Artifact.ID })
		switch {
		case i < 0:
			art := *v.Artifact
			task.Artifacts = append(task.Artifacts, &art)
		case v.Append:
			task.Artifacts[i].Parts = append(task.Artifacts[i].Parts, v.Artifact.Parts...)
		default:
			art := *v.Artifact
			task.Artifacts[i] = &art
		}
	}
	return task
}

// SendStreamingMessage implements a2aclient.Transport. The stream ends at a
// terminal state or at input-required/auth-required. If it stalls longer
// than the stream idle timeout, the task is fetched with GetTask instead of
// republishing (the profile forbids republishing after the first item).
func (t *Transport) SendStreamingMessage(ctx context.Context, params a2aclient.ServiceParams, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	return eventsOf(t.SendStreamingMessageItems(ctx, params, req))
}

// StreamItem is one event of a stream with what a relay needs to batch its writes.
type StreamItem struct {
	// Event is the event, decoded; nil when JSON holds it.
	Event a2a.Event
	// JSON is the event as the agent encoded it, an A2A v1.0 StreamResponse (SendStreamingMessageJSON
	// only, and only for a reply in that shape); nil: encode Event.
	JSON json.RawMessage
	// More reports that the stream's next reply had already arrived when this one was handed
	// on: a relay (the HTTP gateway's SSE writer) can write this event without flushing, as
	// the next one follows at once.
	More bool
}

// SendStreamingMessageItems is SendStreamingMessage with each event's StreamItem.
func (t *Transport) SendStreamingMessageItems(ctx context.Context, params a2aclient.ServiceParams, req *a2a.SendMessageRequest) iter.Seq2[StreamItem, error] {
	return func(yield func(StreamItem, error) bool) {
		req, err := prepareSend(req)
		if err != nil {
			yield(StreamItem{}, err)
			return
		}
		t.stream(ctx, params, t.sendCall(MethodSendStreamingMessage, req, true), yield)
	}
}

// SendStreamingMessageJSON is SendStreamingMessageItems with each event as the agent encoded it
// (StreamItem.JSON) when it is an A2A v1.0 StreamResponse: the HTTP gateway's SSE relay writes it
// on as it came, without decoding it into a2a-go types and encoding it again. Only what ends the
// stream is read from it (the kind of event and its state). A reply in another shape (v0.3's) and
// the task a stalled stream recovers with come decoded (StreamItem.Event).
func (t *Transport) SendStreamingMessageJSON(ctx context.Context, params a2aclient.ServiceParams, req *a2a.SendMessageRequest) iter.Seq2[StreamItem, error] {
	return func(yield func(StreamItem, error) bool) {
		req, err := prepareSend(req)
		if err != nil {
			yield(StreamItem{}, err)
			return
		}
		c := t.sendCall(MethodSendStreamingMessage, req, true)
		c.events = false // decodeReply keeps the result raw
		t.stream(ctx, params, c, yield)
	}
}

// rawStreamItem is the StreamItem of a reply kept raw, and what ends the stream read from it.
func rawStreamItem(c call, rep *reply, first bool) (StreamItem, ReplyItem, error) {
	if len(rep.resp.Result) == 0 {
		return StreamItem{}, ReplyItem{}, fmt.Errorf("a2amqtt: reply to %s has neither result nor error", c.method)
	}
	if ri, ok := rawReplyItem(rep.resp.Result, first); ok {
		return StreamItem{JSON: rep.resp.Result, More: rep.more}, ri, nil
	}
	ev, rpcErr, err := decodeStreamReply(resultEnvelope(rep.resp.Result))
	switch {
	case err != nil:
		return StreamItem{}, ReplyItem{}, fmt.Errorf("a2amqtt: reply to %s is not an A2A stream response: %w", c.method, err)
	case rpcErr != nil:
		return StreamItem{}, ReplyItem{}, rpcErr
	case ev == nil:
		return StreamItem{}, ReplyItem{}, fmt.Errorf("a2amqtt: reply to %s has neither result nor error", c.method)
	}
	return StreamItem{Event: ev, More: rep.more}, replyItemOf(ev, first), nil
}

// rawReplyItem reads what ends a stream from a result in the v1.0 shape: the kind of event (the
// only member's name) and, for a Task or a status update, its state, decoded alone. ok false:
// the result is in another shape.
func rawReplyItem(result json.RawMessage, first bool) (ReplyItem, bool) {
	var state struct {
		Status struct {
			State a2a.TaskState `json:"state"`
		} `json:"status"`
	}
	var kind struct {
		Task         *json.RawMessage `json:"task"`
		StatusUpdate *json.RawMessage `json:"statusUpdate"`
	}
	item := ReplyItem{First: first}
	switch onlyObjectMember(result) {
	case "artifactUpdate":
		item.Kind = ReplyArtifactUpdate
		return item, true
	case "message":
		item.Kind = ReplyMessage
		return item, true
	case "task":
		item.Kind = ReplyTask
	case "statusUpdate":
		item.Kind = ReplyStatusUpdate
	default:
		return item, false
	}
	if json.Unmarshal(result, &kind) != nil {
		return item, false
	}
	member := kind.Task
	if member == nil {
		member = kind.StatusUpdate
	}
	if member == nil || json.Unmarshal(*member, &state) != nil {
		return item, false
	}
	item.State = state.Status.State
	return item, true
}

// eventsOf is a stream's events alone.
func eventsOf(items iter.Seq2[StreamItem, error]) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		for it, err := range items {
			if !yield(it.Event, err) {
				return
			}
		}
	}
}

// SubscribeToTask implements a2aclient.Transport.
func (t *Transport) SubscribeToTask(ctx context.Context, params a2aclient.ServiceParams, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return eventsOf(func(yield func(StreamItem, error) bool) {
		if req == nil || req.ID == "" {
			yield(StreamItem{}, fmt.Errorf("a2amqtt: task id is required: %w", a2a.ErrInvalidParams))
			return
		}
		t.stream(ctx, params, call{target: t.t, method: MethodSubscribeToTask, params: req, taskID: req.ID, stream: true, events: true}, yield)
	})
}

func (t *Transport) stream(ctx context.Context, params a2aclient.ServiceParams, c call, yield func(StreamItem, error) bool) {
	stopped := false
	gotFinal := false
	first := true
	err := t.r.doParams(ctx, c, params, func(rep *reply) (bool, error) {
		it, ri := StreamItem{Event: rep.event, More: rep.more}, ReplyItem{}
		if c.events {
			ri = replyItemOf(rep.event, first)
		} else {
			var err error
			if it, ri, err = rawStreamItem(c, rep, first); err != nil {
				return false, err
			}
		}
		if !yield(it, nil) {
			stopped = true
			return true, errStop
		}
		gotFinal = EndsReplies(MethodSendStreamingMessage, ri)
		first = false
		return gotFinal, nil
	})
	if stopped || gotFinal {
		return
	}
	if errors.Is(err, ErrStreamIdle) && c.taskID != "" {
		// Recover with GetTask (profile: do not republish the request).
		task, gerr := t.GetTask(ctx, params, &a2a.GetTaskRequest{ID: c.taskID})
		if gerr == nil {
			if !yield(StreamItem{Event: task}, nil) {
				return
			}
			if stateEndsStream(task.Status.State) {
				return
			}
		}
	}
	if err != nil {
		yield(StreamItem{}, err)
	}
}

// unary runs a single-result method and decodes the result into out.
func (t *Transport) unary(ctx context.Context, params a2aclient.ServiceParams, c call, out any) error {
	return t.r.doParams(ctx, c, params, func(rep *reply) (bool, error) {
		if err := json.Unmarshal(rep.resp.Result, out); err != nil {
			return true, fmt.Errorf("a2amqtt: decode %s result: %w", c.method, err)
		}
		return true, nil
	})
}

// GetTask implements a2aclient.Transport.
func (t *Transport) GetTask(ctx context.Context, params a2aclient.ServiceParams, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	if req == nil || req.ID == "" {
		return nil, fmt.Errorf("a2amqtt: task id is required: %w", a2a.ErrInvalidParams)
	}
	var task a2a.Task
	if err := t.unary(ctx, params, call{target: t.t, method: MethodGetTask, params: req, taskID: req.ID}, &task); err != nil {
		return nil, err
	}
	return &task, nil
}

// ListTasks implements a2aclient.Transport.
func (t *Transport) ListTasks(ctx context.Context, params a2aclient.ServiceParams, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	if req == nil {
		req = &a2a.ListTasksRequest{}
	}
	var resp a2a.ListTasksResponse
	if err := t.unary(ctx, params, call{target: t.t, method: MethodListTasks, params: req, contextID: req.ContextID}, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// CancelTask implements a2aclient.Transport.
func (t *Transport) CancelTask(ctx context.Context, params a2aclient.ServiceParams, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	if req == nil || req.ID == "" {
		return nil, fmt.Errorf("a2amqtt: task id is required: %w", a2a.ErrInvalidParams)
	}
	var task a2a.Task
	if err := t.unary(ctx, params, call{target: t.t, method: MethodCancelTask, params: req, taskID: req.ID}, &task); err != nil {
		return nil, err
	}
	return &task, nil
}

// GetExtendedAgentCard implements a2aclient.Transport.
func (t *Transport) GetExtendedAgentCard(ctx context.Context, params a2aclient.ServiceParams, req *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	if req == nil {
		req = &a2a.GetExtendedAgentCardRequest{}
	}
	var card a2a.AgentCard
	if err := t.unary(ctx, params, call{target: t.t, method: MethodGetExtendedAgentCard, params: req}, &card); err != nil {
		return nil, err
	}
	return &card, nil
}

// errNoPush explains why push-notification config calls are refused: the
// MQTT reply path (or an event topic) is the delivery channel; webhook push
// configuration has no meaning for a requester reachable only over MQTT.
var errNoPush = fmt.Errorf("a2amqtt: push notification configs are not supported over MQTT (replies stream on the reply topic): %w", a2a.ErrPushNotificationNotSupported)

// GetTaskPushConfig implements a2aclient.Transport (unsupported).
func (t *Transport) GetTaskPushConfig(context.Context, a2aclient.ServiceParams, *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return nil, errNoPush
}

// ListTaskPushConfigs implements a2aclient.Transport (unsupported).
func (t *Transport) ListTaskPushConfigs(context.Context, a2aclient.ServiceParams, *a2a.ListTaskPushConfigRequest) ([]*a2a.PushConfig, error) {
	return nil, errNoPush
}

// CreateTaskPushConfig implements a2aclient.Transport (unsupported).
func (t *Transport) CreateTaskPushConfig(context.Context, a2aclient.ServiceParams, *a2a.PushConfig) (*a2a.PushConfig, error) {
	return nil, errNoPush
}

// DeleteTaskPushConfig implements a2aclient.Transport (unsupported).
func (t *Transport) DeleteTaskPushConfig(context.Context, a2aclient.ServiceParams, *a2a.DeleteTaskPushConfigRequest) error {
	return errNoPush
}

// Destroy implements a2aclient.Transport; it closes the connection only
// when the transport owns it (NewClient).
func (t *Transport) Destroy() error {
	if t.onDestroy != nil {
		return t.onDestroy()
	}
	return nil
}

// doParams is do() with a2aclient service params forwarded as MQTT user
// properties (e.g. A2A-Version).
func (r *Requester) doParams(ctx context.Context, c call, params a2aclient.ServiceParams, handle func(*reply) (bool, error)) error {
	if len(params) > 0 {
		ctx = withServiceParams(ctx, params)
	}
	return r.do(ctx, c, handle)
}

type svcParamsKey struct{}

func withServiceParams(ctx context.Context, p a2aclient.ServiceParams) context.Context {
	return context.WithValue(ctx, svcParamsKey{}, p)
}

func serviceParamsFrom(ctx context.Context) a2aclient.ServiceParams {
	p, _ := ctx.Value(svcParamsKey{}).(a2aclient.ServiceParams)
	return p
}

// InterfaceURL is the supportedInterfaces URL this SDK uses for an agent:
// the broker URL with the request topic as path, e.g.
// mqtt://broker:1883/$a2a/v1/request/org/unit/agent. Only the topic part is
// used for routing; the broker is whatever the requester is connected to.
func InterfaceURL(brokerURL string, agent AgentRef) string {
	return strings.TrimRight(brokerURL, "/") + "/" + agent.RequestTopic()
}

// AgentInterface returns the supportedInterfaces entry for an MQTT agent.
func AgentInterface(brokerURL string, agent AgentRef) *a2a.AgentInterface {
	return a2a.NewAgentInterface(InterfaceURL(brokerURL, agent), TransportProtocolMQTT)
}

// targetFromInterfaceURL extracts the agent or pool from an interface URL
// (anything whose path contains $a2a/v1/request/...).
func targetFromInterfaceURL(raw string) (target, error) {
	s := raw
	if u, err := url.Parse(raw); err == nil && u.Path != "" {
		s = u.Path
	}
	i := strings.Index(s, TopicPrefix+"/"+MethodRequest+"/")
	if i < 0 {
		return target{}, fmt.Errorf("a2amqtt: interface URL %q has no %s/%s/ topic", raw, TopicPrefix, MethodRequest)
	}
	info, err := ParseTopic(s[i:])
	if err != nil {
		return target{}, fmt.Errorf("a2amqtt: interface URL %q: %w", raw, err)
	}
	if info.Pool != "" {
		return target{pool: &PoolRef{Org: info.Org, Unit: info.Unit, Pool: info.Pool}}, nil
	}
	return target{agent: AgentRef{Org: info.Org, Unit: info.Unit, Agent: info.Agent}}, nil
}

// WithMQTTTransport is an a2aclient factory option: agent cards whose
// supportedInterfaces list protocolBinding "MQTT" are reached through r.
// Use with a2aclient.NewFromCard / NewFromEndpoints.
func WithMQTTTransport(r *Requester) a2aclient.FactoryOption {
	return a2aclient.WithTransport(TransportProtocolMQTT, a2aclient.TransportFactoryFn(
		func(_ context.Context, _ *a2a.AgentCard, iface *a2a.AgentInterface) (a2aclient.Transport, error) {
			t, err := targetFromInterfaceURL(iface.URL)
			if err != nil {
				return nil, err
			}
			return &Transport{r: r, t: t}, nil
		}))
}

// ClientConfig configures NewClient.
type ClientConfig struct {
	Config
	RequesterOptions
	// Target is the agent to talk to.
	Target AgentRef
}

// NewClient is the one-call way to talk to an agent: it connects as
// cfg.Agent, subscribes the reply topic and returns a stock a2aclient.Client
// whose Destroy closes the connection.
func NewClient(ctx context.Context, cfg ClientConfig) (*a2aclient.Client, error) {
	if err := cfg.Target.Validate(); err != nil {
		return nil, fmt.Errorf("a2amqtt: target: %w", err)
	}
	conn, err := Connect(ctx, cfg.Config)
	if err != nil {
		return nil, err
	}
	r, err := NewRequester(ctx, conn, cfg.RequesterOptions)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	iface := AgentInterface(cfg.BrokerURL, cfg.Target)
	client, err := a2aclient.NewFromEndpoints(ctx, []*a2a.AgentInterface{iface},
		a2aclient.WithDefaultsDisabled(),
		a2aclient.WithTransport(TransportProtocolMQTT, a2aclient.TransportFactoryFn(
			func(context.Context, *a2a.AgentCard, *a2a.AgentInterface) (a2aclient.Transport, error) {
				tr := r.Transport(cfg.Target)
				tr.onDestroy = func() error {
					cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					return conn.Close(cctx)
				}
				return tr, nil
			})))
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("a2amqtt: build a2a client: %w", err)
	}
	return client, nil
}
