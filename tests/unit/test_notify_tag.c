/* service/notify_tag.c: xferd's tag on copy notifications and the
 * receiver's filter (a stale attempt dropped, a duplicate dropped, untagged
 * and foreign texts passed, the remembered ids bounded). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "notify_tag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A received notification as the engine hands it: one allocation. */
static struct xfer_notif *notif(const char *node, uint64_t inc, int status, uint64_t id,
                                unsigned flags, bool tagged, const char *text)
{
    size_t tl = strlen(text), len = (tagged ? NOTIFY_TAG_LEN : 0) + tl;
    struct xfer_notif *n = calloc(1, sizeof(*n) + len + 1);
    assert_non_null(n);
    snprintf(n->node_id, sizeof(n->node_id), "%s", node);
    n->incarnation = inc;
    n->bound = true;
    n->status = status;
    n->data = (uint8_t *)(n + 1);
    if (tagged)
        notify_tag_put(n->data, id, flags);
    memcpy(n->data + (tagged ? NOTIFY_TAG_LEN : 0), text, tl);
    n->len = len;
    return n;
}

/* Runs the filter; returns whether n was delivered, checks its text. */
static bool pass(struct notify_seen *s, struct xfer_notif *n, const char *text)
{
    bool ok = notify_tag_filter(s, n);
    if (ok) {
        assert_int_equal(n->len, strlen(text));
        assert_memory_equal(n->data, text, n->len);
    }
    free(n);
    return ok;
}

static void test_untagged_and_foreign(void **state)
{
    (void)state;
    struct notify_seen *s = calloc(1, sizeof(*s));
    assert_true(pass(s, notif("n1", 1, 0, 0, 0, false, "hello"), "hello"));
    assert_true(
        pass(s, notif("n1", 1, 0, 0, 0, false, "hello"), "hello")); /* no id: never deduped */
    assert_true(pass(s, notif("n1", 1, 0, 0, 0, false, ""), ""));
    /* starts like a tag but another version: not ours, passed as is */
    struct xfer_notif *n = notif("n1", 1, 0, 7, 0, true, "x");
    n->data[4] = 2;
    assert_true(notify_tag_filter(s, n));
    assert_int_equal(n->len, NOTIFY_TAG_LEN + 1);
    free(n);
    free(s);
}

static void test_retry_once(void **state)
{
    (void)state;
    struct notify_seen *s = calloc(1, sizeof(*s));
    uint64_t id = notify_tag_id();
    assert_true(notify_tag_id() > id);
    /* the stale first attempt is dropped, the retry delivered, stripped */
    assert_false(
        pass(s, notif("n1", 5, -XFER_ESTALE, id, NOTIFY_TAG_MAY_RETRY, true, "req 1"), ""));
    assert_true(pass(s, notif("n1", 5, 0, id, 0, true, "req 1"), "req 1"));
    /* the same id again (an attempt that arrived after all): dropped */
    assert_false(pass(s, notif("n1", 5, 0, id, NOTIFY_TAG_MAY_RETRY, true, "req 1"), ""));
    /* a final attempt that failed stale is delivered, marked failed */
    uint64_t id2 = notify_tag_id();
    assert_true(pass(s, notif("n1", 5, -XFER_ESTALE, id2, 0, true, "req 2"), "req 2"));
    /* other failures of a first attempt are delivered (no retry follows) */
    uint64_t id3 = notify_tag_id();
    assert_true(
        pass(s, notif("n1", 5, -XFER_ERANGE, id3, NOTIFY_TAG_MAY_RETRY, true, "req 3"), "req 3"));
    /* the same id from another sender or incarnation is another copy */
    assert_true(pass(s, notif("n2", 5, 0, id, 0, true, "other node"), "other node"));
    assert_true(pass(s, notif("n1", 6, 0, id, 0, true, "restarted"), "restarted"));
    free(s);
}

static void test_bounded_memory(void **state)
{
    (void)state;
    struct notify_seen *s = calloc(1, sizeof(*s));
    for (uint64_t id = 1; id <= NOTIFY_SEEN_MAX + 10; id++)
        assert_true(pass(s, notif("n1", 1, 0, id, 0, true, "t"), "t"));
    assert_int_equal(s->n, NOTIFY_SEEN_MAX);
    /* the newest are remembered, the oldest 10 forgotten */
    assert_false(pass(s, notif("n1", 1, 0, NOTIFY_SEEN_MAX + 10, 0, true, "t"), ""));
    assert_true(pass(s, notif("n1", 1, 0, 1, 0, true, "t"), "t"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untagged_and_foreign),
        cmocka_unit_test(test_retry_once),
        cmocka_unit_test(test_bounded_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
