locals {
  bucket_name = coalesce(var.bucket_name, "${var.project_id}-jax-cache")
}

resource "google_storage_bucket" "cache" {
  # checkov:skip=CKV_GCP_78: Versioning would keep every pruned or deleted entry as a billed noncurrent version; soft delete (7 days) already makes deletions recoverable.
  # checkov:skip=CKV_GCP_62: Usage logs are legacy; who read or deleted what is in Cloud Audit Logs (enable Data Access logs for storage.googleapis.com), and the service keeps its own prune audit log.
  name                        = local.bucket_name
  location                    = var.region
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  # A cache is rebuildable, but never by accident: `terraform destroy` fails while objects remain.
  force_destroy = false

  # A deleted entry (a prune, or a mistaken `gcloud storage rm`) can be restored for 7 days.
  soft_delete_policy {
    retention_duration_seconds = 7 * 24 * 60 * 60
  }

  # Off by default. Age counts from creation and JAX never rewrites an entry, so this also deletes entries that
  # are hit every day; the next job recompiles them. The service's prune (by last use and total size) is the
  # real policy; this only bounds the bucket if the prune stops running.
  dynamic "lifecycle_rule" {
    for_each = var.backstop_delete_age_days == null ? [] : [var.backstop_delete_age_days]
    content {
      condition {
        age = lifecycle_rule.value
      }
      action {
        type = "Delete"
      }
    }
  }

  labels = {
    app = "jaxcache"
  }
}
