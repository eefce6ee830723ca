package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// chatSession is one `a2actl chat`: the conversation with one agent, line by line.
type chatSession struct {
	c         *cli
	ref       a2amqtt.AgentRef
	tr        *a2amqtt.Transport
	conv      *a2amqtt.Conversation
	statePath string
	// approvalHelpShown: how to answer an approval is explained once per chat.
	approvalHelpShown bool
	// lastTerminal: the last event of the latest turn ended its task.
	lastTerminal bool
}

func (c *cli) chat(ctx context.Context, ref a2amqtt.AgentRef, statePath string) int {
	s, code := c.open(ctx, ref)
	if s == nil {
		return code
	}
	defer s.close()
	ch := &chatSession{c: c, ref: ref, tr: s.tr, statePath: statePath}
	if err := ch.resume(); err != nil {
		return c.fail(exitFailure, err)
	}
	fmt.Fprintf(c.stdout, "chatting with %s (context %s); /new starts a new conversation, /quit exits\n", ref, ch.conv.ContextID())
	if p, ok := ch.conv.Pending(); ok {
		fmt.Fprintf(c.stdout, "agent asked: %s\n", p.Question)
	}
	in := bufio.NewScanner(c.stdin)
	for {
		fmt.Fprint(c.stdout, ch.prompt())
		if !in.Scan() {
			fmt.Fprintln(c.stdout)
			return exitOK
		}
		if code, quit := ch.line(ctx, strings.TrimSpace(in.Text())); quit {
			return code
		}
	}
}

// resume starts the conversation: the one kept in --state when the file exists, else a new one.
func (ch *chatSession) resume() error {
	ch.conv = a2amqtt.NewConversation(ch.tr)
	if ch.statePath == "" {
		return nil
	}
	st, err := a2amqtt.LoadConversationFile(ch.statePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	ch.conv, err = a2amqtt.ResumeConversation(ch.tr, st)
	return err
}

func (ch *chatSession) prompt() string {
	if _, ok := ch.conv.Pending(); ok {
		return "you (answer)> "
	}
	return "you> "
}

// line handles one typed line: a chat command or a turn. quit ends the chat with code.
func (ch *chatSession) line(ctx context.Context, line string) (code int, quit bool) {
	switch line {
	case "":
		return exitOK, false
	case "/quit", "/exit":
		return exitOK, true
	case "/new":
		ch.conv = a2amqtt.NewConversation(ch.tr)
		fmt.Fprintf(ch.c.stdout, "new conversation (context %s)\n", ch.conv.ContextID())
		return exitOK, false
	}
	failed := ch.turn(ctx, ch.message(line))
	if ctx.Err() != nil {
		return exitOK, true
	}
	if !failed {
		ch.explainPause()
	}
	if ch.statePath != "" {
		if err := ch.conv.SaveFile(ch.statePath); err != nil {
			return ch.c.fail(exitFailure, err), true
		}
	}
	return exitOK, false
}

// message is what a typed line sends: /approve and /deny always send the structured answer; an
// approval word does when the agent's pause expects an approval (the words as typed, for agents
// that read text, beside the structured answer the hint asked for); anything else is text.
func (ch *chatSession) message(line string) *a2a.Message {
	if approve, reason, ok := parseApprovalCommand(line); ok {
		return a2amqtt.ApprovalMessage(approve, reason)
	}
	if p, ok := ch.conv.Pending(); ok && p.Continuation != nil && p.Continuation.ExpectedInput == a2amqtt.ExpectApproval {
		if approve, _, ok := parseApproval(line); ok {
			return approvalAnswer(approve, line, "")
		}
	}
	return a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(line))
}

// turn streams msg's events to the terminal; failed is whether the call ended in an error (it
// is printed, and the chat goes on).
func (ch *chatSession) turn(ctx context.Context, msg *a2a.Message) (failed bool) {
	ch.lastTerminal = false
	for ev, err := range ch.conv.Stream(ctx, msg) {
		if err != nil {
			ch.c.classify(ch.ref, err)
			return true
		}
		ch.lastTerminal = isTerminal(ev)
		ch.c.printEvent(ev)
	}
	return false
}

// explainPause says what the agent waits for after a turn, or that the task is done.
func (ch *chatSession) explainPause() {
	out := ch.c.stdout
	p, ok := ch.conv.Pending()
	if !ok {
		if ch.lastTerminal {
			fmt.Fprintf(out, "(task done)\n")
		}
		return
	}
	fmt.Fprintf(out, "agent asks: %s\n", p.Question)
	if p.Continuation != nil && p.Continuation.ExpectedInput == a2amqtt.ExpectApproval && !ch.approvalHelpShown {
		fmt.Fprintln(out, "(answer approve, yes or go ahead to approve; deny or no to refuse; /approve or /deny REASON with a reason)")
		ch.approvalHelpShown = true
	}
}
