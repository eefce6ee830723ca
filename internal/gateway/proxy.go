package gateway

import (
	"context"
	"iter"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
)

// transportKey carries the request's client transport (the caller's requester, aimed at the
// target) from the HTTP layer to forwarder.
type transportKey struct{}

func withTransport(ctx context.Context, t a2aclient.Transport) context.Context {
	return context.WithValue(ctx, transportKey{}, t)
}

// forwarder is an a2asrv.RequestHandler that forwards every method to the client transport the
// request carries: a2a-go's JSON-RPC server decodes and encodes (SSE included), the SDK's MQTT
// transport carries the call on the bus. It sends no service parameters on: the HTTP caller's
// headers (its bearer token among them) stay at the gateway.
type forwarder struct{}

var _ a2asrv.RequestHandler = forwarder{}

func transportOf(ctx context.Context) a2aclient.Transport {
	t, _ := ctx.Value(transportKey{}).(a2aclient.Transport)
	return t
}

// keep records err for the response writer, so that the HTTP caller gets the JSON-RPC error
// exactly as an MQTT caller would (rpcerror.go).
func keep(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	return recordError(ctx, err)
}

func keepSeq(ctx context.Context, seq iter.Seq2[a2a.Event, error]) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		for ev, err := range seq {
			if err != nil {
				err = recordError(ctx, err)
			}
			if !yield(ev, err) {
				return
			}
		}
	}
}

func (forwarder) GetTask(ctx context.Context, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	v, err := transportOf(ctx).GetTask(ctx, nil, req)
	return v, keep(ctx, err)
}

func (forwarder) ListTasks(ctx context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	v, err := transportOf(ctx).ListTasks(ctx, nil, req)
	return v, keep(ctx, err)
}

func (forwarder) CancelTask(ctx context.Context, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	v, err := transportOf(ctx).CancelTask(ctx, nil, req)
	return v, keep(ctx, err)
}

func (forwarder) SendMessage(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	if err := callErrorOf(ctx); err != nil {
		return nil, keep(ctx, err) // the fast path made the call (fastsend.go)
	}
	v, err := transportOf(ctx).SendMessage(ctx, nil, req)
	return v, keep(ctx, err)
}

func (forwarder) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return keepSeq(ctx, transportOf(ctx).SubscribeToTask(ctx, nil, req))
}

func (forwarder) SendStreamingMessage(ctx context.Context, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	if err := callErrorOf(ctx); err != nil {
		// The fast path made the call (streamfast.go): its error, after the events it wrote.
		return func(yield func(a2a.Event, error) bool) { yield(nil, keep(ctx, err)) }
	}
	return keepSeq(ctx, transportOf(ctx).SendStreamingMessage(ctx, nil, req))
}

// Push notifications are not translated (docs/gateway.md): the bus has no webhook to call.

func (forwarder) GetTaskPushConfig(context.Context, *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

func (forwarder) ListTaskPushConfigs(context.Context, *a2a.ListTaskPushConfigRequest) (*a2a.ListTaskPushConfigResponse, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

func (forwarder) CreateTaskPushConfig(context.Context, *a2a.PushConfig) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

func (forwarder) DeleteTaskPushConfig(context.Context, *a2a.DeleteTaskPushConfigRequest) error {
	return a2a.ErrPushNotificationNotSupported
}

func (forwarder) GetExtendedAgentCard(context.Context, *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	return nil, a2a.ErrExtendedCardNotConfigured
}
