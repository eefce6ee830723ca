package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// setCondition sets one condition of an object's status, stamped with the generation it
// describes: the one way every reconciler writes a condition.
func setCondition(conds *[]metav1.Condition, generation int64, condType string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
	})
}

// patchStatus patches obj's status from before when, and only when, status(before) and
// status(obj) differ (a reconcile that changes nothing writes nothing). It reports whether it
// patched; an object deleted meanwhile is not an error. Reconcilers call it once, deferred, with
// the copy they took after fetching the object.
func patchStatus[T client.Object](ctx context.Context, c client.Client, before, obj T, status func(T) any) (bool, error) {
	if equality.Semantic.DeepEqual(status(before), status(obj)) {
		return false, nil
	}
	if err := c.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil {
		if errors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("update status: %w", err)
	}
	return true, nil
}
