"""The word-timing method's own tuning set: sentences and rates apart from the benchmark's.

``pipecat_veena/timing.py``'s constants were chosen on these 40 Hindi (some code-mixed) and 40
English sentences at 130, 180 and 230 words a minute (the benchmark, ``benchmarks/timing.py``,
uses other sentences at 140 and 210), so the benchmark measures how the method generalises.
Rerun after changing the method; it prints the same table and writes nothing.

    .venv/bin/python -m benchmarks.timing_tune
"""

from __future__ import annotations

from benchmarks._espeak import Espeak
from benchmarks.timing import Result, _row, evaluate

HINDI = [
    "कृपया अपना मोबाइल नंबर दोबारा बताइए।",
    "आपका खाता अभी सक्रिय है, चिंता मत कीजिए।",
    "हमने आपकी बुकिंग 14 जून के लिए कर दी है।",
    "बिल की आखिरी तारीख 20 तारीख है।",
    "आपका कोड 5521 है, इसे दर्ज करें।",
    "मैं आपकी कॉल किसी वरिष्ठ अधिकारी को ट्रांसफ़र कर रही हूँ।",
    "आज बाज़ार में सब्ज़ियों के दाम बढ़ गए हैं।",
    "आपने ₹3,200 का भुगतान किया है।",
    "क्या आप कल सुबह 9 बजे आ सकते हैं?",
    "हमारा दफ़्तर शनिवार को आधे दिन खुलता है।",
    "आपकी policy अगले महीने renew होगी।",
    "यह गाड़ी 2019 मॉडल की है।",
    "स्कूल की छुट्टियाँ अगले हफ़्ते से शुरू होंगी।",
    "आपका नया कार्ड सात दिनों में पहुँच जाएगा।",
    "पानी की सप्लाई सुबह छह बजे से आठ बजे तक रहेगी।",
    "आपके loan की किस्त ₹8,750 है।",
    "अस्पताल का नंबर 108 है, तुरंत फ़ोन करें।",
    "कृपया थोड़ी देर बाद फिर से कोशिश करें।",
    "आपने जो सामान मँगाया था, वह रास्ते में है।",
    "बारिश की वजह से उड़ान 2 घंटे देर से है।",
    "आपका PIN बदल दिया गया है।",
    "हम आपको एक SMS भेज रहे हैं, उसे ध्यान से पढ़ें।",
    "मेरे पास अभी इसकी पूरी जानकारी नहीं है।",
    "कल शाम को बिजली कटौती हो सकती है।",
    "आपकी रिपोर्ट 3 दिन में तैयार होगी।",
    "इस योजना में 60 साल से ऊपर के लोग शामिल हैं।",
    "आपका सवाल बहुत अच्छा है, मैं अभी बताती हूँ।",
    "दुकान रात दस बजे बंद हो जाती है।",
    "कृपया अपनी जन्मतिथि बताइए।",
    "आपकी सीट खिड़की के पास है।",
    "हमारे नए store में 20% की छूट है।",
    "मुझे माफ़ कीजिए, मैं आपकी बात समझ नहीं पाई।",
    "घर से निकलने से पहले छाता ले लीजिए।",
    "आपके खाते से ₹150 कटे हैं।",
    "ट्रेन 12 बजकर 40 मिनट पर छूटेगी।",
    "अगर कोई और सवाल हो तो ज़रूर पूछिए।",
    "आपका password कम से कम आठ अक्षर का होना चाहिए।",
    "हमारी helpline चौबीस घंटे खुली रहती है।",
    "गुरुवार को मेला लगेगा, सब लोग आइए।",
    "आपका शुक्रिया, फिर मिलेंगे।",
]
ENGLISH = [
    "Good morning, thank you for calling customer support.",
    "Your appointment is booked for Thursday at 3:15.",
    "I have sent a verification code to your phone.",
    "The code is 739215, it expires in ten minutes.",
    "Please hold on while I transfer your call.",
    "Your balance is ₹12,480 as of yesterday.",
    "We could not process your request, please try again.",
    "The store opens at nine and closes at eight.",
    "Your package was delivered to the front desk.",
    "Would you like me to repeat that information?",
    "The next available slot is on the 22nd of June.",
    "Your subscription renews automatically every month.",
    "I understand your concern, and I apologize for the delay.",
    "The refund of ₹640 will reach your account in five days.",
    "Kindly confirm your date of birth.",
    "Our office is located near the central railway station.",
    "The flight to Mumbai has been rescheduled to 7:20.",
    "You have three missed calls and one voicemail.",
    "Your KYC documents have been verified successfully.",
    "Press one for English, or two for Hindi.",
    "The temperature tonight will drop to 18 degrees.",
    "We have added 500 bonus points to your wallet.",
    "Could you spell your surname for me, please?",
    "Your insurance claim is being processed.",
    "The bus leaves from gate number 6 every hour.",
    "Make sure the device is fully charged before use.",
    "This call may be recorded for quality purposes.",
    "Your new SIM card will be activated within 24 hours.",
    "I can see that your last payment was received.",
    "The library remains closed during the festival week.",
    "Remember to carry a valid photo identity card.",
    "Your order number is 58214, keep it for reference.",
    "The speed limit on this road is 60 kilometres an hour.",
    "Thank you for your patience, goodbye and take care.",
    "Mera account kab tak update hoga, please bataiye.",
    "Breakfast is served between seven and ten thirty.",
    "Your electricity usage this month was 245 units.",
    "Unfortunately, the item you ordered is out of stock.",
    "I will email the invoice to you right away.",
    "The hospital visiting hours are from four to seven.",
]

RATES = (130, 180, 230)


def main() -> str:
    """The tuning set's errors, ours beside the baseline, per language and rate."""
    espeak = Espeak()
    rows = [
        "| language | rate (wpm) | words | median ms (ours) | p90 ms (ours) | median ms "
        "(chars) | p90 ms (chars) | p90 ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, voice, sentences in (("Hindi", "hi", HINDI), ("English", "en", ENGLISH)):
        both = Result([], [])
        for rate in RATES:
            r = evaluate(espeak, sentences, voice, rate)
            both.ours += r.ours
            both.baseline += r.baseline
            rows.append(_row(name, str(rate), r))
        rows.append(_row(f"**{name}**", "all", both))
    return "\n".join(rows)


if __name__ == "__main__":
    print(main())  # noqa: T201 (a command-line report)
