"""The capacity page and the schedules on the deployment page, server side: who sees which buttons, the profile
figures, and each schedule with whether it is active now."""
from controlplane.capacity.models import Profile
from controlplane.capacity.services.schedules import schedule_create
from controlplane.models import Pool


def test_the_deployment_page_lists_schedules_and_whether_they_are_active(client_for, viewer, operator, deployment):
    pool = Pool.objects.get(deployment=deployment, role="decode")
    schedule_create(pool=pool, actor=operator, name="always", cron="* * * * *", duration_minutes=1440, min_replicas=2)
    schedule_create(pool=pool, actor=operator, name="never-now", cron="0 0 1 1 *", duration_minutes=1,
                    timezone="Asia/Tokyo", max_replicas=3)
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert 'id="schedules"' in html and "/deployments/demo/capacity/" in html
    always = html[html.index("<td>always</td>"):][:600]
    assert "active until" in always and "2..–" in always
    never = html[html.index("<td>never-now</td>"):][:600]
    assert "inactive" in never and "Asia/Tokyo" in never


def test_the_capacity_page_shows_profiles_and_buttons_by_role(client_for, viewer, operator, admin, deployment):
    Profile.objects.create(revision=deployment.current_revision, role="decode",
                           fits={"decode": {"a": 0.01, "b": 0.001, "c": 0.0}},
                           points={"decode": [{"batch": 1, "context": 32, "step_s": 0.011, "source": "synthetic"},
                                              {"batch": 2, "context": 40, "step_s": 0.012, "source": "live"}]})
    viewer_html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    assert 'id="chart-decode"' in viewer_html and "default live" in viewer_html
    assert 'id="plan-apply"' not in viewer_html and 'id="profile-start"' not in viewer_html
    operator_html = client_for(operator).get("/deployments/demo/capacity/").content.decode()
    assert 'id="plan-apply"' in operator_html and 'id="profile-start"' not in operator_html
    assert 'id="profile-start"' in client_for(admin).get("/deployments/demo/capacity/").content.decode()


def test_without_a_profile_the_page_says_how_to_make_one(client_for, viewer, deployment):
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    assert "manage.py tandem_profile demo" in html


def test_an_unknown_deployment_is_a_404(client_for, viewer, db):
    assert client_for(viewer).get("/deployments/nope/capacity/").status_code == 404
