package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// demoAPIPath serves the dashboard's demo controls. It exists only under
// `fleetgraph demo`, so the dashboard shows the controls only there.
const demoAPIPath = "/demo/api"

// newDemoAPI serves the demo controls beside the fleetgraph API:
//
//	GET  /demo/api   {"clusters": [...], "actions": [...]}
//	POST /demo/api   {"cluster": "east", "action": "stop"}
//
// Only fleet admins may use it: anyone else gets 401 or 403.
func newDemoAPI(authn authz.Authenticator, fleet *demoFleet, api http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.HandleFunc(demoAPIPath, func(w http.ResponseWriter, r *http.Request) {
		u, err := authn.Authenticate(r.Context(), authz.CredentialsFromRequest(r))
		if err != nil {
			writeDemoJSON(w, http.StatusUnauthorized, map[string]string{"error": "sign in as a fleet admin to use the demo controls"})
			return
		}
		if !slices.Contains(u.GetGroups(), demoAdminGroup) {
			writeDemoJSON(w, http.StatusForbidden, map[string]string{"error": "the demo controls are for fleet admins (group " + demoAdminGroup + ")"})
			return
		}
		switch r.Method {
		case http.MethodGet:
			writeDemoJSON(w, http.StatusOK, map[string]any{"clusters": fleet.status(), "actions": demoActions})
		case http.MethodPost:
			var req struct{ Cluster, Action string }
			if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
				writeDemoJSON(w, http.StatusBadRequest, map[string]string{"error": "send JSON: {\"cluster\": \"east\", \"action\": \"stop\"}"})
				return
			}
			if err := fleet.act(r.Context(), req.Cluster, req.Action); err != nil {
				writeDemoJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
				return
			}
			writeDemoJSON(w, http.StatusOK, map[string]any{"clusters": fleet.status()})
		default:
			w.Header().Set("Allow", "GET, POST")
			writeDemoJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use GET or POST"})
		}
	})
	return mux
}

func writeDemoJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// churnOnce makes the cluster's k-th change: a pod of team-a-0 or team-a-1
// crash-loops on one tick and recovers on the next, so that at most one pod
// per cluster is broken by churn; every fifth tick a short-lived pod
// appears in team-a-0 and one from 25 ticks ago goes.
func churnOnce(ctx context.Context, c *testcluster.Cluster, k int) error {
	pods := c.Client().CoreV1().Pods(fmt.Sprintf("team-a-%d", (k/16)%2))
	pod, err := pods.Get(ctx, fmt.Sprintf("pod-%d", (k/2)%8), metav1.GetOptions{})
	if err != nil {
		return err
	}
	pod.Status = flipPodStatus(pod.Status)
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if k%5 != 0 {
		return nil
	}
	short := c.Client().CoreV1().Pods("team-a-0")
	_, err = short.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("churn-%d", k), Labels: map[string]string{"app": "churn"}},
		Spec:       corev1.PodSpec{NodeName: "node-0", Containers: []corev1.Container{{Name: "main", Image: "registry.example/churn:1.0"}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	err = short.Delete(ctx, fmt.Sprintf("churn-%d", k-25), metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(errors.New("delete an old churn pod"), err)
	}
	return nil
}

// flipPodStatus turns a running pod into a crash-looping one and back.
func flipPodStatus(s corev1.PodStatus) corev1.PodStatus {
	ready := len(s.ContainerStatuses) > 0 && s.ContainerStatuses[0].Ready
	main := corev1.ContainerStatus{Name: "main", Image: "x"}
	if ready {
		main.RestartCount = 3
		main.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container main"}
		return corev1.PodStatus{
			Phase:             corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: "containers with unready status: [main]"}},
			ContainerStatuses: []corev1.ContainerStatus{main},
		}
	}
	now := metav1.Now()
	main.Ready = true
	main.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
	return corev1.PodStatus{
		Phase:             corev1.PodRunning,
		StartTime:         &now,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{main},
	}
}
