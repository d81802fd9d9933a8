# Least privilege by role (deploy/README.md, "Who may do what"). Every grant is on the cache bucket only, never on
# the project, and every principal is a Kubernetes service account through GKE Workload Identity: no keys.

locals {
  workload_pool = "${var.project_id}.svc.id.goog"
}

# The service lists the cache, reads entry heads and records, and deletes what a prune selects. It never writes.
# No predefined role fits: objectViewer cannot delete, objectUser and objectAdmin also create and overwrite.
resource "google_project_iam_custom_role" "service" {
  role_id     = "jaxcacheService"
  title       = "jaxcache service"
  description = "List, read and delete objects of the jaxcache bucket; no create, no overwrite."
  permissions = [
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
  ]
}

# Training jobs and warm-up read every entry and create new ones (JAX's process 0 writes), but must never delete
# or overwrite one: in GCS, replacing an existing object needs storage.objects.delete as well as create, so
# without delete an upload to an existing name is refused. storage.buckets.get (bucket metadata only, not its
# IAM policy) is there because gcsfs, which JAX uses for gs:// paths, checks that the bucket exists before it
# creates the cache directory.
resource "google_project_iam_custom_role" "read_create" {
  role_id     = "jaxcacheReadCreate"
  title       = "jaxcache jobs and warm-up"
  description = "Read and create objects of the jaxcache bucket; never delete or overwrite."
  permissions = [
    "storage.buckets.get",
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
  ]
}

resource "google_service_account" "service" {
  account_id   = "jaxcache-service"
  display_name = "jaxcache catalog service"
}

resource "google_service_account" "training" {
  account_id   = "jaxcache-training"
  display_name = "jaxcache: training jobs"
}

resource "google_service_account" "warmup" {
  account_id   = "jaxcache-warmup"
  display_name = "jaxcache: warm-up jobs"
}

resource "google_storage_bucket_iam_member" "service" {
  bucket = google_storage_bucket.cache.name
  role   = google_project_iam_custom_role.service.name
  member = "serviceAccount:${google_service_account.service.email}"
}

resource "google_storage_bucket_iam_member" "training" {
  bucket = google_storage_bucket.cache.name
  role   = google_project_iam_custom_role.read_create.name
  member = "serviceAccount:${google_service_account.training.email}"
}

resource "google_storage_bucket_iam_member" "warmup" {
  bucket = google_storage_bucket.cache.name
  role   = google_project_iam_custom_role.read_create.name
  member = "serviceAccount:${google_service_account.warmup.email}"
}

# Workload Identity: each Kubernetes service account may act as its Google service account, and nothing else may.
resource "google_service_account_iam_member" "service_workload_identity" {
  service_account_id = google_service_account.service.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${local.workload_pool}[${var.service_namespace}/${var.service_ksa}]"
}

resource "google_service_account_iam_member" "training_workload_identity" {
  for_each           = toset(var.training_namespaces)
  service_account_id = google_service_account.training.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${local.workload_pool}[${each.value}/${var.training_ksa}]"
}

resource "google_service_account_iam_member" "warmup_workload_identity" {
  for_each           = toset(var.warmup_namespaces)
  service_account_id = google_service_account.warmup.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${local.workload_pool}[${each.value}/${var.warmup_ksa}]"
}
